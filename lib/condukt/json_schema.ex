defmodule Condukt.JSONSchema do
  @moduledoc """
  A small JSON Schema validator for the subset that tool parameters and
  structured outputs use. Written here because Hex is not reachable on
  every build machine.

  Supported keywords: `type` (a name or a list of names: `"object"`,
  `"array"`, `"string"`, `"integer"`, `"number"`, `"boolean"`, `"null"`),
  `properties`, `required`, `additionalProperties` (a boolean or a schema),
  `items`, `enum`, `const`, `minLength`, `maxLength`, `minimum`, `maximum`,
  `minItems`, `maxItems`, `anyOf` and `oneOf`. Other keywords (`pattern`,
  `format`, `$ref`, …) are ignored, so a schema that relies on them is
  checked less strictly than it says; keep output schemas within the subset.

  Schemas may use atom or string keys (`%{type: "object"}` or
  `%{"type" => "object"}`); values are the decoded JSON (maps with string
  keys).

      iex> schema = %{type: "object", properties: %{n: %{type: "integer"}}, required: ["n"]}
      iex> Condukt.JSONSchema.validate(%{"n" => 1}, schema)
      :ok
      iex> Condukt.JSONSchema.validate(%{"n" => "one"}, schema)
      {:error, ["$.n: expected integer, got \\"one\\""]}
  """

  @doc "Validates `value` against `schema`; the errors name the JSON path."
  @spec validate(term(), map()) :: :ok | {:error, [String.t()]}
  def validate(value, schema) when is_map(schema) do
    case check(value, stringify(schema), "$") do
      [] -> :ok
      errors -> {:error, errors}
    end
  end

  @doc "The schema with every key a string (the form sent to providers)."
  @spec stringify(term()) :: term()
  def stringify(%{} = map) when not is_struct(map),
    do: Map.new(map, fn {k, v} -> {to_string(k), stringify(v)} end)

  def stringify(list) when is_list(list), do: Enum.map(list, &stringify/1)
  def stringify(atom) when is_atom(atom) and atom not in [nil, true, false], do: Atom.to_string(atom)
  def stringify(other), do: other

  defp check(value, schema, path) do
    Enum.flat_map(schema, fn {key, arg} -> keyword(key, arg, value, schema, path) end)
  end

  defp keyword("type", types, value, _schema, path) do
    types = List.wrap(types)
    if Enum.any?(types, &type?(&1, value)), do: [], else: [err(path, "expected #{Enum.join(types, " or ")}", value)]
  end

  defp keyword("enum", values, value, _schema, path) when is_list(values),
    do: if(value in values, do: [], else: [err(path, "expected one of #{inspect(values)}", value)])

  defp keyword("const", c, value, _schema, path),
    do: if(value == c, do: [], else: [err(path, "expected #{inspect(c)}", value)])

  defp keyword("properties", props, value, _schema, path) when is_map(value) and is_map(props) do
    Enum.flat_map(props, fn {name, sub} ->
      case Map.fetch(value, name) do
        {:ok, v} -> check(v, sub, path <> "." <> name)
        :error -> []
      end
    end)
  end

  defp keyword("required", names, value, _schema, path) when is_map(value) and is_list(names) do
    for name <- names, not Map.has_key?(value, name), do: "#{path}: missing required property #{inspect(name)}"
  end

  defp keyword("additionalProperties", extra, value, schema, path) when is_map(value) do
    known = Map.get(schema, "properties", %{})

    value
    |> Enum.reject(fn {k, _} -> Map.has_key?(known, k) end)
    |> Enum.flat_map(fn {k, v} ->
      case extra do
        false -> ["#{path}: unexpected property #{inspect(k)}"]
        %{} = sub -> check(v, sub, path <> "." <> to_string(k))
        _ -> []
      end
    end)
  end

  defp keyword("items", sub, value, _schema, path) when is_list(value) and is_map(sub) do
    value |> Enum.with_index() |> Enum.flat_map(fn {v, i} -> check(v, sub, "#{path}[#{i}]") end)
  end

  defp keyword("minLength", n, value, _schema, path) when is_binary(value),
    do: if(String.length(value) >= n, do: [], else: ["#{path}: shorter than #{n} characters"])

  defp keyword("maxLength", n, value, _schema, path) when is_binary(value),
    do: if(String.length(value) <= n, do: [], else: ["#{path}: longer than #{n} characters"])

  defp keyword("minimum", n, value, _schema, path) when is_number(value),
    do: if(value >= n, do: [], else: [err(path, "expected at least #{n}", value)])

  defp keyword("maximum", n, value, _schema, path) when is_number(value),
    do: if(value <= n, do: [], else: [err(path, "expected at most #{n}", value)])

  defp keyword("minItems", n, value, _schema, path) when is_list(value),
    do: if(length(value) >= n, do: [], else: ["#{path}: fewer than #{n} items"])

  defp keyword("maxItems", n, value, _schema, path) when is_list(value),
    do: if(length(value) <= n, do: [], else: ["#{path}: more than #{n} items"])

  defp keyword("anyOf", subs, value, _schema, path) when is_list(subs) do
    if Enum.any?(subs, &(check(value, &1, path) == [])), do: [], else: [err(path, "matches none of anyOf", value)]
  end

  defp keyword("oneOf", subs, value, _schema, path) when is_list(subs) do
    case Enum.count(subs, &(check(value, &1, path) == [])) do
      1 -> []
      n -> [err(path, "matches #{n} of oneOf (expected exactly one)", value)]
    end
  end

  defp keyword(_key, _arg, _value, _schema, _path), do: []

  defp type?("object", v), do: is_map(v)
  defp type?("array", v), do: is_list(v)
  defp type?("string", v), do: is_binary(v)
  defp type?("integer", v), do: is_integer(v) or (is_float(v) and Float.round(v) == v)
  defp type?("number", v), do: is_number(v)
  defp type?("boolean", v), do: is_boolean(v)
  defp type?("null", v), do: is_nil(v)
  defp type?(_, _), do: false

  defp err(path, what, value), do: "#{path}: #{what}, got #{inspect(value, limit: 5, printable_limit: 60)}"
end
