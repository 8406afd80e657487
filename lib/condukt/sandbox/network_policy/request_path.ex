defmodule Condukt.Sandbox.NetworkPolicy.RequestPath do
  @moduledoc """
  Request paths as the network policy matches them (`docs/path-matching.md`):
  normalising a request target, validating path patterns and the path glob.
  The sidecar (`c_src/policy/path.c`) implements the same rules; the shared
  vector file keeps the two in agreement.
  """

  import Bitwise

  @typedoc "Why a path pattern was refused."
  @type pattern_error ::
          :empty
          | :too_long
          | :not_absolute
          | :query
          | :invalid_byte
          | :encoded_separator
          | :empty_segment
          | :dot_segment
          | :stars

  # The longest request path (before its query) and the longest pattern.
  @max_path 8192
  @max_pattern 1024

  @doc """
  Normalises a request target (origin-form; the query from the first `?` on
  is dropped): unreserved `%XX` decoded, other escapes' hex upper-cased, dot
  segments removed. Returns `:error` for a path that is refused: not
  starting with `/`, a `#`, a byte outside visible ASCII, a `\\`, a
  malformed escape, `%2F`, `%5C` or `%00`, `//`, a `.`/`..` segment followed
  by `;`, a `..` above the root, or more than 8192 bytes.

      iex> Condukt.Sandbox.NetworkPolicy.RequestPath.normalize("/repos/myorg/%2e%2e/x?y=1")
      {:ok, "/repos/x"}
      iex> Condukt.Sandbox.NetworkPolicy.RequestPath.normalize("/repos/myorg/%2E%2E%2Fx")
      :error
  """
  @spec normalize(binary()) :: {:ok, binary()} | :error
  def normalize(target) when is_binary(target) do
    path = target |> :binary.split("?") |> hd()

    with true <- byte_size(path) in 1..@max_path and :binary.first(path) == ?/,
         {:ok, decoded} <- decode(path),
         {:ok, normalized} <- segments(decoded, false) do
      {:ok, normalized}
    else
      _ -> :error
    end
  end

  @doc """
  Validates and normalises a path pattern: as a request path, but a pattern
  names no dot segment and `**` only as a whole segment.
  """
  @spec normalize_pattern(term()) :: {:ok, binary()} | {:error, pattern_error()}
  def normalize_pattern(""), do: {:error, :empty}

  def normalize_pattern(pattern) when is_binary(pattern) do
    cond do
      byte_size(pattern) > @max_pattern -> {:error, :too_long}
      :binary.first(pattern) != ?/ -> {:error, :not_absolute}
      true -> with {:ok, decoded} <- decode(pattern), {:ok, norm} <- segments(decoded, true), do: check_stars(norm)
    end
  end

  def normalize_pattern(_), do: {:error, :invalid_byte}

  @doc """
  Matches a normalised path against a normalised pattern: `*` matches any
  run of characters within one segment, `**` (a whole segment) any number
  of whole segments, including none.
  """
  @spec match?(binary(), binary()) :: boolean()
  def match?("/" <> pattern, "/" <> path) do
    segs_match?(:binary.split(pattern, "/", [:global]), :binary.split(path, "/", [:global]))
  end

  def match?(_pattern, _path), do: false

  @doc """
  The path of a dry-run URL as the sidecar takes it: what follows the
  authority up to a `#` (`"/"` when that is empty or only a query); `nil`
  for a bare `host[:port]`, which has no path.
  """
  @spec url_path(binary()) :: binary() | nil
  def url_path(target) when is_binary(target) do
    case :binary.split(target, "://") do
      [_scheme, rest] ->
        case :binary.match(rest, ["/", "?", "#"]) do
          {pos, _} ->
            tail = rest |> binary_part(pos, byte_size(rest) - pos) |> :binary.split("#") |> hd()
            if String.starts_with?(tail, "/"), do: tail, else: "/"

          :nomatch ->
            "/"
        end

      [_host] ->
        nil
    end
  end

  ## Normalising ------------------------------------------------------------------

  defp decode(path), do: decode(path, [])

  defp decode(<<>>, acc), do: {:ok, acc |> Enum.reverse() |> IO.iodata_to_binary()}
  defp decode(<<c, _::binary>>, _acc) when c in [?#, ??], do: {:error, :query}
  defp decode(<<c, _::binary>>, _acc) when c <= 0x20 or c >= 0x7F or c == ?\\, do: {:error, :invalid_byte}

  defp decode(<<?%, hi, lo, rest::binary>>, acc) do
    with {:ok, h} <- hex(hi), {:ok, l} <- hex(lo) do
      case h * 16 + l do
        v when v in [?/, ?\\, 0] -> {:error, :encoded_separator}
        v -> decode(rest, [escape(v) | acc])
      end
    else
      :error -> {:error, :invalid_byte}
    end
  end

  defp decode(<<?%, _::binary>>, _acc), do: {:error, :invalid_byte}
  defp decode(<<c, rest::binary>>, acc), do: decode(rest, [c | acc])

  defp hex(c) when c in ?0..?9, do: {:ok, c - ?0}
  defp hex(c) when c in ?a..?f, do: {:ok, c - ?a + 10}
  defp hex(c) when c in ?A..?F, do: {:ok, c - ?A + 10}
  defp hex(_), do: :error

  # RFC 3986 §2.3: unreserved characters stand for themselves.
  defp escape(v) when v in ?A..?Z or v in ?a..?z or v in ?0..?9 or v in [?-, ?., ?_, ?~], do: v
  defp escape(v), do: [?%, hex_digit(v >>> 4), hex_digit(v &&& 15)]

  defp hex_digit(d) when d < 10, do: ?0 + d
  defp hex_digit(d), do: ?A + d - 10

  # Dot segments removed (RFC 3986 §5.2.4), a climb above the root
  # refused, "//" refused; a pattern names no dot segment at all.
  defp segments("/" <> rest, pattern?) do
    segs = :binary.split(rest, "/", [:global])
    last = length(segs) - 1

    segs
    |> Enum.with_index()
    |> Enum.reduce_while({[], false}, fn {seg, i}, {out, _trailing} ->
      case classify(seg) do
        :empty when i < last -> {:halt, {:error, :empty_segment}}
        :empty -> {:cont, {out, true}}
        :dot_params -> {:halt, {:error, :dot_segment}}
        _dot when pattern? and seg in [".", ".."] -> {:halt, {:error, :dot_segment}}
        :dot -> {:cont, {out, true}}
        :dotdot when out == [] -> {:halt, {:error, :dot_segment}}
        :dotdot -> {:cont, {tl(out), true}}
        :segment -> {:cont, {[seg | out], false}}
      end
    end)
    |> case do
      {:error, reason} ->
        {:error, reason}

      {out, trailing} ->
        joined = out |> Enum.reverse() |> Enum.map(&["/", &1]) |> IO.iodata_to_binary()
        {:ok, if(joined == "" or trailing, do: joined <> "/", else: joined)}
    end
  end

  defp classify(""), do: :empty
  defp classify("."), do: :dot
  defp classify(".."), do: :dotdot
  defp classify(".;" <> _), do: :dot_params
  defp classify("..;" <> _), do: :dot_params
  defp classify(_), do: :segment

  defp check_stars(norm) do
    norm
    |> :binary.split("/", [:global])
    |> Enum.all?(fn seg -> seg == "**" or not String.contains?(seg, "**") end)
    |> if(do: {:ok, norm}, else: {:error, :stars})
  end

  ## Matching ---------------------------------------------------------------------

  # The greedy walk with one backtrack point (as the sidecar's): exact for
  # one kind of star, and O(pattern * path) whatever the input.
  defp segs_match?(pattern, path) do
    walk(List.to_tuple(pattern), List.to_tuple(path), 0, 0, nil, 0)
  end

  defp walk(p, s, pi, si, star, mark) do
    np = tuple_size(p)

    cond do
      si == tuple_size(s) ->
        Enum.all?(pi..(np - 1)//1, &(elem(p, &1) == "**"))

      pi < np and elem(p, pi) == "**" ->
        walk(p, s, pi + 1, si, pi, si)

      pi < np and seg_match?(elem(p, pi), elem(s, si)) ->
        walk(p, s, pi + 1, si + 1, star, mark)

      star != nil ->
        walk(p, s, star + 1, mark + 1, star, mark + 1)

      true ->
        false
    end
  end

  defp seg_match?(pattern, seg) do
    if String.contains?(pattern, "*") do
      parts = :binary.split(pattern, "*", [:global])
      glob_parts?(parts, seg)
    else
      pattern == seg
    end
  end

  # parts are the literal runs between the stars: the first anchors the
  # start, the last the end, the others are found left to right.
  defp glob_parts?([first | rest], seg) do
    String.starts_with?(seg, first) and
      middle?(rest, binary_part(seg, byte_size(first), byte_size(seg) - byte_size(first)))
  end

  defp middle?([last], seg), do: String.ends_with?(seg, last)

  defp middle?([part | rest], seg) do
    case :binary.match(seg, part) do
      _ when part == "" ->
        middle?(rest, seg)

      {pos, len} ->
        middle?(rest, binary_part(seg, pos + len, byte_size(seg) - pos - len))

      :nomatch ->
        false
    end
  end
end
