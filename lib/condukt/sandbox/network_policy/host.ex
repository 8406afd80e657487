defmodule Condukt.Sandbox.NetworkPolicy.Host do
  @moduledoc """
  **Internal.** Part of the library's plumbing, documented for those who
  work on Condukt; its API may change in any release.

  Host normalisation and glob matching, exactly as `docs/host-matching.md`
  specifies them.

  The C rule engine of `condukt-egress` implements the same page; the shared
  vector file `native_test/vectors/policy_vectors.json` keeps the two in
  agreement. Change both or neither.

  A normalised host is one of:

    * `{:name, ascii}` — a DNS name, lower case, IDN labels in `xn--` form;
    * `{:ipv4, <<_::32>>}` and `{:ipv6, <<_::128>>}` — IP literals (an
      IPv4-mapped IPv6 address becomes `:ipv4`).

  A normalised pattern is one of those, or `{:glob, ascii}` when it
  contains `*`.
  """

  import Bitwise

  @max_label 63
  @max_name 253
  # docs/host-matching.md and c_src/policy/host.c (LABEL_INPUT_MAX).
  @max_idn_label_input 1024

  @typedoc "A normalised request host."
  @type t :: {:name, binary()} | {:ipv4, <<_::32>>} | {:ipv6, <<_::128>>}

  @typedoc "A normalised host pattern."
  @type pattern :: t() | {:glob, binary()}

  @typedoc "Why a pattern is invalid (the codes of docs/host-matching.md §2)."
  @type pattern_error ::
          :empty
          | :scheme
          | :cidr
          | :path
          | :port
          | :star_run
          | :empty_label
          | :bad_char
          | :bad_utf8
          | :wildcard_idn
          | :label_too_long
          | :name_too_long
          | :bad_ip

  @typedoc "The target of a dry run after parsing."
  @type target_error :: :invalid_host | :invalid_url

  ## Request hosts ------------------------------------------------------------

  @doc """
  Normalises a request host (`host`, `host:port`, `[v6]:port`, trailing
  dot, IDN) per docs/host-matching.md §1. Returns `:error` for an invalid
  host.
  """
  @spec normalize(binary()) :: {:ok, t()} | :error
  def normalize(host) when is_binary(host) do
    case strip_port(host) do
      {:ok, {:ip, ip}} -> {:ok, ip}
      {:ok, {:name, name}} -> normalize_name(name, :host)
      :error -> :error
    end
  end

  defp strip_port(""), do: :error

  defp strip_port("[" <> rest) do
    case :binary.split(rest, "]") do
      [addr, ""] -> with {:ok, ip} <- parse_ipv6(addr), do: {:ok, {:ip, ip}}
      [addr, ":" <> port] -> with :ok <- check_port(port), {:ok, ip} <- parse_ipv6(addr), do: {:ok, {:ip, ip}}
      _ -> :error
    end
  end

  defp strip_port(host) do
    case :binary.split(host, ":", [:global]) do
      [name] -> {:ok, {:name, name}}
      [name, port] -> with :ok <- check_port(port), do: {:ok, {:name, name}}
      _ -> with {:ok, ip} <- parse_ipv6(host), do: {:ok, {:ip, ip}}
    end
  end

  defp check_port(port) do
    if byte_size(port) in 1..5 and all_digits?(port) and String.to_integer(port) <= 65_535,
      do: :ok,
      else: :error
  end

  defp normalize_name(name, mode) do
    name = drop_trailing_dot(name)

    cond do
      name == "" ->
        if mode == :host, do: :error, else: {:error, :empty_label}

      ip = parse_ipv4(name) ->
        {:ok, {:ipv4, ip}}

      true ->
        with {:ok, labels} <- convert_labels(:binary.split(name, ".", [:global]), mode, []),
             ascii = Enum.join(labels, "."),
             :ok <- check_name_length(ascii, mode),
             :ok <- check_last_label(List.last(labels), mode),
             :ok <- check_ip_shaped_glob(ascii, mode) do
          cond do
            mode == :host -> {:ok, {:name, ascii}}
            String.contains?(ascii, "*") -> {:ok, {:glob, ascii}}
            true -> {:ok, {:name, ascii}}
          end
        end
    end
  end

  defp drop_trailing_dot(name) do
    if String.ends_with?(name, "."), do: binary_part(name, 0, byte_size(name) - 1), else: name
  end

  defp convert_labels([], _mode, acc), do: {:ok, Enum.reverse(acc)}

  defp convert_labels([label | rest], mode, acc) do
    case convert_label(label, mode) do
      {:ok, ascii} when byte_size(ascii) > @max_label -> fail(mode, :label_too_long)
      {:ok, ascii} -> convert_labels(rest, mode, [ascii | acc])
      {:error, _} = error -> error
      :error -> :error
    end
  end

  defp convert_label("", mode), do: fail(mode, :empty_label)

  defp convert_label(label, mode) do
    if ascii?(label) do
      if ascii_label_ok?(label, mode), do: {:ok, ascii_downcase(label)}, else: fail(mode, :bad_char)
    else
      convert_idn_label(label, mode)
    end
  end

  defp convert_idn_label(label, mode) do
    cond do
      not String.valid?(label) ->
        fail(mode, :bad_utf8)

      mode == :pattern and String.contains?(label, "*") ->
        fail(mode, :wildcard_idn)

      # No label of more input bytes than this can convert to 63 bytes or
      # fewer; refusing it before conversion bounds the work (Punycode is
      # quadratic). The C engine draws the same line (LABEL_INPUT_MAX).
      byte_size(label) > @max_idn_label_input ->
        ascii_ok = Enum.all?(:binary.bin_to_list(label), &(&1 >= 0x80 or ldh?(&1) or &1 in ?A..?Z))
        if ascii_ok, do: fail(mode, :label_too_long), else: fail(mode, :bad_char)

      true ->
        codepoints = label |> String.downcase() |> nfc()

        cond do
          not Enum.all?(codepoints, &(&1 >= 0x80 or ldh?(&1))) -> fail(mode, :bad_char)
          Enum.all?(codepoints, &(&1 < 0x80)) -> {:ok, List.to_string(codepoints)}
          # An A-label holds "xn--" plus at least one byte per code point.
          length(codepoints) > @max_label -> fail(mode, :label_too_long)
          true -> {:ok, "xn--" <> punycode_encode(codepoints)}
        end
    end
  end

  # NFC as a list of code points. OTP 25's :unicode NFC does not compose two
  # starters (both canonical combining class 0) when another character
  # precedes them — Bengali U+0995 U+09C7 U+09BE stays decomposed where NFC
  # gives U+0995 U+09CB — while libunistring, which the sidecar uses, does.
  # An adjacent pair that composes on its own is not blocked in context (it
  # is adjacent, and its first member is a starter, so the last starter), so
  # composing such pairs left to right completes the job.
  defp nfc(string) do
    string |> :unicode.characters_to_nfc_list() |> compose_adjacent()
  end

  defp compose_adjacent([a, b | rest]) do
    case :unicode.characters_to_nfc_list([a, b]) do
      [c] -> compose_adjacent([c | rest])
      _ -> [a | compose_adjacent([b | rest])]
    end
  end

  defp compose_adjacent(short), do: short

  defp check_name_length(ascii, mode) do
    if byte_size(ascii) > @max_name, do: fail(mode, :name_too_long), else: :ok
  end

  # A name ending in a numeric or 0x label is an IPv4 spelling that some
  # resolvers accept (inet_aton: "127.1", "0x7f.0.0.1"); it must not pass as
  # a DNS name (docs/host-matching.md §1 step 9).
  defp check_last_label(label, mode) do
    numeric = all_digits?(label)

    hex =
      case label do
        "0x" <> rest -> Enum.all?(:binary.bin_to_list(rest), &hex_digit?/1)
        _ -> false
      end

    if numeric or hex, do: fail(mode, :bad_ip), else: :ok
  end

  # A glob of only digits, "*" and dots ("10.*.*.*") reads as an address
  # range, but globs never match IP literals, so such a rule would silently
  # match nothing; refuse it (docs/host-matching.md §2 step 11).
  defp check_ip_shaped_glob(ascii, :pattern) do
    bytes = :binary.bin_to_list(ascii)

    if ?* in bytes and Enum.any?(bytes, &(&1 in ?0..?9)) and Enum.all?(bytes, &(&1 in ?0..?9 or &1 in [?*, ?.])),
      do: {:error, :bad_ip},
      else: :ok
  end

  defp check_ip_shaped_glob(_ascii, :host), do: :ok

  defp fail(:host, _code), do: :error
  defp fail(:pattern, code), do: {:error, code}

  ## Patterns -----------------------------------------------------------------

  @doc """
  Validates and normalises a host pattern per docs/host-matching.md §2.
  """
  @spec normalize_pattern(binary()) :: {:ok, pattern()} | {:error, pattern_error()}
  def normalize_pattern(""), do: {:error, :empty}

  def normalize_pattern(pattern) when is_binary(pattern) do
    colons = length(:binary.matches(pattern, ":"))

    cond do
      String.contains?(pattern, "://") ->
        {:error, :scheme}

      String.contains?(pattern, ["/", "?", "#"]) ->
        if cidr?(pattern), do: {:error, :cidr}, else: {:error, :path}

      String.starts_with?(pattern, "[") ->
        with true <- String.ends_with?(pattern, "]") and byte_size(pattern) >= 2,
             {:ok, ip} <- parse_ipv6(binary_part(pattern, 1, byte_size(pattern) - 2)) do
          {:ok, ip}
        else
          _ -> {:error, :bad_ip}
        end

      colons >= 2 ->
        case parse_ipv6(pattern) do
          {:ok, ip} -> {:ok, ip}
          :error -> {:error, :bad_ip}
        end

      colons == 1 ->
        {:error, :port}

      String.contains?(pattern, "***") ->
        {:error, :star_run}

      true ->
        normalize_name(pattern, :pattern)
    end
  end

  # ADDR/N, an address range (docs/host-matching.md §2 step 3): an IPv4
  # address, or an IPv6 one bare or in brackets, then 1 to 3 digits.
  defp cidr?(pattern) do
    case :binary.split(pattern, "/") do
      [addr, len] -> len =~ ~r/\A[0-9]{1,3}\z/ and ip_literal?(addr)
      _ -> false
    end
  end

  defp ip_literal?("[" <> rest) do
    String.ends_with?(rest, "]") and parse_ipv6(binary_part(rest, 0, byte_size(rest) - 1)) != :error
  end

  defp ip_literal?(addr), do: parse_ipv4(addr) != nil or parse_ipv6(addr) != :error

  ## Matching -----------------------------------------------------------------

  @doc """
  Does the normalised `pattern` match the normalised `host`? IP literals
  match IP literals of the same family by address; globs only match names.
  """
  @spec match?(pattern(), t()) :: boolean()
  def match?({:glob, glob}, {:name, name}), do: glob_match?(glob, name)
  def match?(same, same), do: true
  def match?(_pattern, _host), do: false

  # `*` matches one or more characters other than "."; `**` one or more of
  # any character. This is an NFA simulation over pattern positions, so the
  # work is O(|glob| * |name|) whatever the pattern (no backtracking).
  defp glob_match?(glob, name) do
    tokens = tokenize(glob, []) |> List.to_tuple()
    last = tuple_size(tokens)
    start = closure(MapSet.new([{0, :at}]), tokens)

    final =
      Enum.reduce_while(:binary.bin_to_list(name), start, fn char, states ->
        next = step(states, char, tokens) |> closure(tokens)
        if MapSet.size(next) == 0, do: {:halt, next}, else: {:cont, next}
      end)

    MapSet.member?(final, {last, :at})
  end

  defp tokenize("**" <> rest, acc), do: tokenize(rest, [:any | acc])
  defp tokenize("*" <> rest, acc), do: tokenize(rest, [:label | acc])
  defp tokenize(<<c, rest::binary>>, acc), do: tokenize(rest, [c | acc])
  defp tokenize("", acc), do: Enum.reverse(acc)

  defp step(states, char, tokens) do
    for {i, where} <- states,
        i < tuple_size(tokens),
        next = advance(elem(tokens, i), where, i, char),
        into: MapSet.new(),
        do: next
  end

  defp advance(c, :at, i, c) when is_integer(c), do: {i + 1, :at}
  defp advance(:label, _where, i, c) when c != ?., do: {i, :in}
  defp advance(:any, _where, i, _c), do: {i, :in}
  defp advance(_token, _where, _i, _c), do: nil

  # Having consumed at least one character inside a star, the automaton
  # may move on to the next token without consuming.
  defp closure(states, _tokens) do
    Enum.reduce(states, states, fn
      {i, :in}, acc -> MapSet.put(acc, {i + 1, :at})
      _, acc -> acc
    end)
  end

  ## Dry-run targets ------------------------------------------------------------

  @doc """
  Parses the target of a dry run: a URL (anything containing `://`) or a
  bare `host[:port]`, per docs/host-matching.md §4.
  """
  @spec parse_target(binary()) :: {:ok, t()} | {:error, target_error()}
  def parse_target(target) when is_binary(target) do
    case :binary.split(target, "://") do
      [scheme, rest] ->
        authority = rest |> :binary.split(["/", "?", "#"]) |> hd()

        cond do
          ascii_downcase(scheme) not in ["http", "https", "ws", "wss"] -> {:error, :invalid_url}
          String.contains?(authority, "\\") -> {:error, :invalid_url}
          true -> authority |> after_last_at() |> normalize_target()
        end

      [host] ->
        normalize_target(host)
    end
  end

  defp after_last_at(authority) do
    case :binary.matches(authority, "@") do
      [] ->
        authority

      matches ->
        {pos, 1} = List.last(matches)
        binary_part(authority, pos + 1, byte_size(authority) - pos - 1)
    end
  end

  defp normalize_target(host) do
    case normalize(host) do
      {:ok, normalized} -> {:ok, normalized}
      :error -> {:error, :invalid_host}
    end
  end

  ## Text forms -----------------------------------------------------------------

  @doc """
  The text of a normalised host or pattern: the ASCII name, a dotted quad,
  or RFC 5952 IPv6 text (eight hex groups, the longest run of two or more
  zero groups compressed, the first run on a tie).
  """
  @spec to_text(pattern()) :: binary()
  def to_text({kind, name}) when kind in [:name, :glob], do: name
  def to_text({:ipv4, <<a, b, c, d>>}), do: "#{a}.#{b}.#{c}.#{d}"

  def to_text({:ipv6, bin}) do
    groups = for <<g::16 <- bin>>, do: g
    hex = Enum.map(groups, &Integer.to_string(&1, 16)) |> Enum.map(&String.downcase/1)

    case longest_zero_run(groups) do
      nil ->
        Enum.join(hex, ":")

      {start, len} ->
        {left, rest} = Enum.split(hex, start)
        right = Enum.drop(rest, len)
        Enum.join(left, ":") <> "::" <> Enum.join(right, ":")
    end
  end

  defp longest_zero_run(groups) do
    {best, start, len} =
      groups
      |> Enum.with_index()
      |> Enum.reduce({nil, nil, 0}, fn
        {0, i}, {best, nil, 0} -> {best, i, 1}
        {0, _i}, {best, start, len} -> {best, start, len + 1}
        {_, _i}, {best, start, len} -> {better(best, start, len), nil, 0}
      end)

    better(best, start, len)
  end

  defp better(best, nil, _len), do: best
  defp better(best, _start, len) when len < 2, do: best
  defp better(nil, start, len), do: {start, len}
  defp better({_, best_len}, start, len) when len > best_len, do: {start, len}
  defp better(best, _start, _len), do: best

  ## IP literals ---------------------------------------------------------------

  # Strict dotted quad: four parts of 1-3 digits, each <= 255, no leading
  # zero (docs/host-matching.md §1 step 6). Returns the 4 bytes or nil.
  defp parse_ipv4(text) do
    case :binary.split(text, ".", [:global]) do
      [_, _, _, _] = parts ->
        octets = Enum.map(parts, &ipv4_part/1)
        if Enum.all?(octets, &is_integer/1), do: :binary.list_to_bin(octets), else: nil

      _ ->
        nil
    end
  end

  defp ipv4_part(part) do
    cond do
      byte_size(part) not in 1..3 or not all_digits?(part) -> nil
      byte_size(part) > 1 and String.starts_with?(part, "0") -> nil
      String.to_integer(part) > 255 -> nil
      true -> String.to_integer(part)
    end
  end

  # RFC 4291 §2.2 text forms, parsed by hand so that the C engine and this
  # module accept exactly the same spellings.
  defp parse_ipv6(text) do
    with true <- text != "" and Enum.all?(:binary.bin_to_list(text), &(hex_digit?(&1) or &1 in [?:, ?.])),
         {head, tail, compressed?} <- split_compression(text),
         {:ok, head_groups} <- ipv6_groups(head, tail == nil or not compressed?),
         {:ok, tail_groups} <- ipv6_groups(tail, true),
         {:ok, groups} <- assemble(head_groups, tail_groups, compressed?) do
      bin = for g <- groups, into: <<>>, do: <<g::16>>
      {:ok, unmap(bin)}
    else
      _ -> :error
    end
  end

  defp split_compression(text) do
    case :binary.split(text, "::", [:global]) do
      [all] -> {all, nil, false}
      [head, tail] -> {head, tail, true}
      _ -> :error
    end
  end

  # `allow_v4?` says whether this piece may end in a dotted IPv4 part (only
  # the last piece of the address may).
  defp ipv6_groups(nil, _allow_v4?), do: {:ok, []}
  defp ipv6_groups("", _allow_v4?), do: {:ok, []}

  defp ipv6_groups(piece, allow_v4?) do
    parts = :binary.split(piece, ":", [:global])
    {init, [last]} = Enum.split(parts, -1)

    with {:ok, init_groups} <- hex_groups(init),
         {:ok, last_groups} <- last_groups(last, allow_v4?) do
      {:ok, init_groups ++ last_groups}
    end
  end

  defp last_groups(last, allow_v4?) do
    if String.contains?(last, ".") do
      case allow_v4? && parse_ipv4(last) do
        <<a::16, b::16>> -> {:ok, [a, b]}
        _ -> :error
      end
    else
      hex_groups([last])
    end
  end

  defp hex_groups(parts) do
    if Enum.all?(parts, &(byte_size(&1) in 1..4 and not String.contains?(&1, "."))),
      do: {:ok, Enum.map(parts, &String.to_integer(&1, 16))},
      else: :error
  end

  defp assemble(head, tail, false) do
    if length(head) == 8 and tail == [], do: {:ok, head}, else: :error
  end

  defp assemble(head, tail, true) do
    zeros = 8 - length(head) - length(tail)
    if zeros >= 1, do: {:ok, head ++ List.duplicate(0, zeros) ++ tail}, else: :error
  end

  defp unmap(<<0::80, 0xFFFF::16, v4::binary-size(4)>>), do: {:ipv4, v4}
  defp unmap(bin), do: {:ipv6, bin}

  ## Punycode (RFC 3492) ---------------------------------------------------------

  @base 36
  @tmin 1
  @tmax 26
  @skew 38
  @damp 700
  @initial_bias 72
  @initial_n 128

  @doc false
  # RFC 3492 §6.3 encoding of a list of code points, without the "xn--"
  # prefix. Exposed for tests.
  @spec punycode_encode([non_neg_integer()]) :: binary()
  def punycode_encode(codepoints) do
    basic = for c <- codepoints, c < 0x80, do: c
    b = length(basic)
    out = if b > 0, do: basic ++ [?-], else: []
    encode_loop(codepoints, @initial_n, 0, @initial_bias, b, b, length(codepoints), Enum.reverse(out))
  end

  defp encode_loop(_cps, _n, _delta, _bias, h, _b, total, out) when h >= total do
    out |> Enum.reverse() |> List.to_string()
  end

  defp encode_loop(cps, n, delta, bias, h, b, total, out) do
    m = cps |> Enum.filter(&(&1 >= n)) |> Enum.min()
    delta = delta + (m - n) * (h + 1)

    {delta, bias, h, out} =
      Enum.reduce(cps, {delta, bias, h, out}, fn c, {delta, bias, h, out} ->
        cond do
          c < m ->
            {delta + 1, bias, h, out}

          c == m ->
            out = encode_variable(delta, bias, @base, out)
            bias = adapt(delta, h + 1, h == b)
            {0, bias, h + 1, out}

          true ->
            {delta, bias, h, out}
        end
      end)

    encode_loop(cps, m + 1, delta + 1, bias, h, b, total, out)
  end

  defp encode_variable(q, bias, k, out) do
    t = threshold(k, bias)

    if q < t do
      [digit(q) | out]
    else
      encode_variable(div(q - t, @base - t), bias, k + @base, [digit(t + rem(q - t, @base - t)) | out])
    end
  end

  defp threshold(k, bias) when k <= bias, do: @tmin
  defp threshold(k, bias) when k >= bias + @tmax, do: @tmax
  defp threshold(k, bias), do: k - bias

  defp adapt(delta, numpoints, first?) do
    delta = if first?, do: div(delta, @damp), else: delta >>> 1
    delta = delta + div(delta, numpoints)
    adapt_loop(delta, 0, numpoints)
  end

  defp adapt_loop(delta, k, numpoints) do
    if delta > div((@base - @tmin) * @tmax, 2) do
      adapt_loop(div(delta, @base - @tmin), k + @base, numpoints)
    else
      k + div((@base - @tmin + 1) * delta, delta + @skew)
    end
  end

  defp digit(d) when d < 26, do: ?a + d
  defp digit(d), do: ?0 + d - 26

  ## Character classes -----------------------------------------------------------

  defp ascii?(bin), do: Enum.all?(:binary.bin_to_list(bin), &(&1 < 0x80))
  defp all_digits?(""), do: false
  defp all_digits?(bin), do: Enum.all?(:binary.bin_to_list(bin), &(&1 in ?0..?9))
  defp hex_digit?(c), do: c in ?0..?9 or c in ?a..?f or c in ?A..?F
  defp ldh?(c), do: c in ?a..?z or c in ?0..?9 or c in [?-, ?_]

  defp ascii_label_ok?(label, mode) do
    Enum.all?(:binary.bin_to_list(label), fn c ->
      ldh?(c) or c in ?A..?Z or (mode == :pattern and c == ?*)
    end)
  end

  defp ascii_downcase(bin), do: for(<<c <- bin>>, into: "", do: <<if(c in ?A..?Z, do: c + 32, else: c)>>)
end
