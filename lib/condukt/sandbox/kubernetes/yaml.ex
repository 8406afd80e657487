defmodule Condukt.Sandbox.Kubernetes.YAML do
  @moduledoc false
  # A YAML emitter for the subset Kubernetes objects use as JSON values:
  # maps with string keys, lists, strings, integers, floats, booleans and
  # nil, in block style. A string that a YAML 1.1 or 1.2 reader could take
  # for anything but that string (a number, a boolean, null, a date,
  # something with an indicator or a line break) is written double-quoted
  # with JSON escapes, which YAML double-quoted scalars accept as they are.

  # The first keys of a Kubernetes object, in kubectl's order; the rest
  # follow sorted.
  @first ["apiVersion", "kind", "metadata", "name", "type"]

  @doc "The documents, each starting with `---`."
  @spec encode_documents([map()]) :: String.t()
  def encode_documents(docs), do: Enum.map_join(docs, "", &("---\n" <> encode(&1)))

  @doc "One document (a map), without the `---` line."
  @spec encode(map()) :: String.t()
  def encode(map) when is_map(map) and map_size(map) > 0, do: IO.iodata_to_binary(block(map, 0))
  def encode(value), do: scalar(value) <> "\n"

  defp block(map, ind) do
    for {k, v} <- ordered(map), do: [pad(ind), key(k), ":", after_key(v, ind)]
  end

  defp after_key(v, ind) when is_map(v) and map_size(v) > 0, do: ["\n", block(v, ind + 2)]
  defp after_key([_ | _] = v, ind), do: ["\n", items(v, ind + 2)]
  defp after_key(v, _ind), do: [" ", scalar(v), "\n"]

  # A map item is its block with the first indentation replaced by "- ".
  defp items(list, ind) do
    for item <- list do
      cond do
        is_map(item) and map_size(item) > 0 ->
          <<_::binary-size(ind + 2), rest::binary>> = IO.iodata_to_binary(block(item, ind + 2))
          [pad(ind), "- ", rest]

        is_list(item) and item != [] ->
          [pad(ind), "-\n", items(item, ind + 2)]

        true ->
          [pad(ind), "- ", scalar(item), "\n"]
      end
    end
  end

  defp ordered(map) do
    {first, rest} = Enum.split_with(map, fn {k, _} -> to_string(k) in @first end)
    Enum.sort_by(first, fn {k, _} -> Enum.find_index(@first, &(&1 == to_string(k))) end) ++ Enum.sort(rest)
  end

  defp pad(n), do: :binary.copy(" ", n)

  defp key(k), do: string(to_string(k))

  defp scalar(nil), do: "null"
  defp scalar(true), do: "true"
  defp scalar(false), do: "false"
  defp scalar(n) when is_integer(n), do: Integer.to_string(n)
  defp scalar(f) when is_float(f), do: Float.to_string(f)
  defp scalar(m) when is_map(m), do: "{}"
  defp scalar([]), do: "[]"
  defp scalar(a) when is_atom(a), do: string(Atom.to_string(a))
  defp scalar(s) when is_binary(s), do: string(s)

  # Plain when nothing in it means anything to a YAML reader.
  @reserved ~w(true false yes no on off y n null ~ nan inf .nan .inf -.inf +.inf)
  defp string(s) do
    plain? =
      s =~ ~r/\A[A-Za-z_\/][A-Za-z0-9_.\/-]*\z/ and String.downcase(s) not in @reserved and
        not (s =~ ~r/\A[0-9+.-]/)

    if plain?, do: s, else: quoted(s)
  end

  defp quoted(s) do
    body =
      for <<c::utf8 <- s>>, into: "" do
        case c do
          ?" -> "\\\""
          ?\\ -> "\\\\"
          ?\n -> "\\n"
          ?\t -> "\\t"
          ?\r -> "\\r"
          c when c < 0x20 or c == 0x7F -> "\\u" <> String.pad_leading(Integer.to_string(c, 16), 4, "0")
          c -> <<c::utf8>>
        end
      end

    "\"" <> body <> "\""
  end
end
