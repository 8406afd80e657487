defmodule Condukt.Sandbox.Kubernetes.Glob do
  @moduledoc false
  # Path.wildcard/2 patterns (`*`, `?`, `**`, `{a,b}`, `[a-z]`) as a
  # regular expression over a path relative to the search root, so that
  # the pod only lists files (`find`) and the matching happens here: no
  # pattern reaches a shell or find's own pattern syntax.

  @wild [?*, ??, ?[, ?{]

  @doc """
  `{literal_dir, regex, max_depth}`: the leading directory segments with
  no wildcard (where `find` starts), a regex for the whole pattern, and
  the depth below `literal_dir` that `find` needs (`nil`: unbounded, `**`).
  """
  @spec compile(String.t(), boolean()) :: {:ok, {String.t(), Regex.t(), pos_integer() | nil}} | {:error, String.t()}
  def compile(pattern, match_dot?) do
    segs = String.split(pattern, "/")
    {literal, rest} = Enum.split_while(Enum.drop(segs, -1), &(not wild?(&1)))
    rest = rest ++ [List.last(segs)]

    depth = if Enum.any?(rest, &String.contains?(&1, "**")), do: nil, else: length(rest)

    with {:ok, source} <- translate(String.to_charlist(pattern), match_dot?, true, []),
         {:ok, regex} <- Regex.compile("\\A" <> source <> "\\z", "s") do
      {:ok, {Enum.join(literal, "/"), regex, depth}}
    else
      {:error, {why, _}} -> {:error, "#{why}"}
      {:error, why} -> {:error, why}
    end
  end

  defp wild?(seg), do: Enum.any?(String.to_charlist(seg), &(&1 in @wild))

  # start? = at the start of a path segment (where a dot must be literal
  # unless match_dot).
  defp translate([], _dot, _start?, acc), do: {:ok, IO.iodata_to_binary(Enum.reverse(acc))}

  defp translate([?*, ?*, ?/ | rest], dot, true, acc),
    do: translate(rest, dot, true, ["(?:#{seg(dot)}/)*" | acc])

  defp translate([?*, ?*], dot, true, acc),
    do: translate([], dot, false, ["(?:#{seg(dot)}(?:/#{seg(dot)})*)?" | acc])

  defp translate([?*, ?* | rest], dot, start?, acc), do: translate([?* | rest], dot, start?, acc)

  defp translate([?* | rest], dot, start?, acc),
    do: translate(rest, dot, false, [if(start? and not dot, do: "(?!\\.)[^/]*", else: "[^/]*") | acc])

  defp translate([?? | rest], dot, start?, acc),
    do: translate(rest, dot, false, [if(start? and not dot, do: "[^/.]", else: "[^/]") | acc])

  defp translate([?[ | rest], dot, _start?, acc) do
    case class(rest, []) do
      {:ok, class, rest} -> translate(rest, dot, false, [class | acc])
      :error -> {:error, "unterminated [ in the pattern"}
    end
  end

  defp translate([?{ | rest], dot, start?, acc) do
    case alternatives(rest, 0, [], []) do
      {:ok, alts, rest} ->
        translated = Enum.map(alts, &translate(&1, dot, start?, []))

        case Enum.find(translated, &match?({:error, _}, &1)) do
          # Like :filelib (whose listing hides dot entries), a brace group
          # at a segment start never matches a dot name unless match_dot.
          nil ->
            guard = if start? and not dot, do: "(?!\\.)", else: ""
            translate(rest, dot, false, [guard <> "(?:" <> Enum.map_join(translated, "|", &elem(&1, 1)) <> ")" | acc])

          error ->
            error
        end

      :error ->
        {:error, "unterminated { in the pattern"}
    end
  end

  defp translate([?/ | rest], dot, _start?, acc), do: translate(rest, dot, true, ["/" | acc])
  defp translate([c | rest], dot, _start?, acc), do: translate(rest, dot, false, [Regex.escape(<<c::utf8>>) | acc])

  defp seg(true), do: "[^/]+"
  defp seg(false), do: "(?!\\.)[^/]+"

  defp class([?] | rest], []), do: class(rest, [?]])
  defp class([?] | rest], acc), do: {:ok, "[" <> escape_class(Enum.reverse(acc)) <> "]", rest}
  defp class([c | rest], acc), do: class(rest, [c | acc])
  defp class([], _), do: :error

  defp escape_class([neg | rest]) when neg in [?!, ?^], do: "^" <> escape_class_body(rest)
  defp escape_class(chars), do: escape_class_body(chars)

  defp escape_class_body(chars) do
    chars
    |> Enum.map(fn
      c when c in [?\\, ?[, ?]] -> <<?\\, c>>
      c -> <<c::utf8>>
    end)
    |> IO.iodata_to_binary()
  end

  # Splits "a,b{c,d}}rest" into ["a", "b{c,d}"] and "rest".
  defp alternatives([], _depth, _cur, _alts), do: :error
  defp alternatives([?} | rest], 0, cur, alts), do: {:ok, Enum.reverse([Enum.reverse(cur) | alts]), rest}
  defp alternatives([?, | rest], 0, cur, alts), do: alternatives(rest, 0, [], [Enum.reverse(cur) | alts])
  defp alternatives([?{ | rest], d, cur, alts), do: alternatives(rest, d + 1, [?{ | cur], alts)
  defp alternatives([?} | rest], d, cur, alts), do: alternatives(rest, d - 1, [?} | cur], alts)
  defp alternatives([c | rest], d, cur, alts), do: alternatives(rest, d, [c | cur], alts)
end
