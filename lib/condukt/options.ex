defmodule Condukt.Options do
  @moduledoc """
  **Internal.** Part of the library's plumbing, documented for those who
  work on Condukt; its API may change in any release.

  A small declarative option schema, used both to validate options and to
  render their documentation (the idea of NimbleOptions, written here
  because Hex is not reachable on every build machine).

  A schema is a keyword list of `{key, spec}` where `spec` is a keyword list:

    * `:type` — `:pos_integer`, `:non_neg_integer`, `:boolean`, `:map`,
      `:string`, `{:list, :string}`, `:keyword`, `:any`, `{:in, values}`, or
      `{:custom, fun}` where `fun` returns `:ok` or
      `{:error, expected :: String.t()}`;
    * `:default` — the value used when the key is absent;
    * `:required` — `true` when the key must be present;
    * `:max` — an upper bound for integer types;
    * `:doc` — one sentence for the rendered docs.
  """

  @type schema :: keyword(keyword())
  @type error ::
          {:unknown, key :: term(), suggestion :: atom() | nil}
          | {:missing, atom()}
          | {:invalid, atom(), value :: term(), expected :: String.t()}

  @doc """
  Validates `opts` (a keyword list) against `schema`. Returns the options
  with every default filled in, in schema order.
  """
  @spec validate(keyword(), schema()) :: {:ok, keyword()} | {:error, error()}
  def validate(opts, schema) when is_list(opts) do
    known = Keyword.keys(schema)

    with :ok <- check_unknown(opts, known) do
      map_ok(schema, fn {key, spec} ->
        with {:ok, value} <- fetch(opts, key, spec), do: {:ok, {key, value}}
      end)
    end
  end

  @doc """
  Maps `fun` over `enum`, stopping at the first `{:error, _}`. `fun` returns
  `{:ok, value}` (kept), `:skip` (dropped) or `{:error, reason}`.
  """
  @spec map_ok(Enumerable.t(), (term() -> {:ok, term()} | :skip | {:error, term()})) ::
          {:ok, list()} | {:error, term()}
  def map_ok(enum, fun) do
    enum
    |> Enum.reduce_while({:ok, []}, fn item, {:ok, acc} ->
      case fun.(item) do
        {:ok, value} -> {:cont, {:ok, [value | acc]}}
        :skip -> {:cont, {:ok, acc}}
        {:error, _} = error -> {:halt, error}
      end
    end)
    |> case do
      {:ok, acc} -> {:ok, Enum.reverse(acc)}
      error -> error
    end
  end

  @doc "The closest known key to `key`, for \"did you mean …?\" hints."
  @spec suggest(term(), [atom()]) :: atom() | nil
  def suggest(key, known) when is_atom(key) or is_binary(key) do
    name = to_string(key)

    known
    |> Enum.map(&{&1, String.jaro_distance(name, Atom.to_string(&1))})
    |> Enum.filter(fn {_, score} -> score >= 0.8 end)
    |> Enum.max_by(fn {_, score} -> score end, fn -> {nil, 0} end)
    |> elem(0)
  end

  def suggest(_key, _known), do: nil

  @doc """
  One sentence for an error of `validate/2`: "unknown option :tiemout (did
  you mean :timeout?)", "option :timeout must be a positive integer, got
  -1", "option :policy is required".
  """
  @spec format_error(error()) :: String.t()
  def format_error({:unknown, key, nil}), do: "unknown option #{inspect(key)}"
  def format_error({:unknown, key, hint}), do: "unknown option #{inspect(key)} (did you mean #{inspect(hint)}?)"
  def format_error({:missing, key}), do: "option #{inspect(key)} is required"

  def format_error({:invalid, key, value, expected}),
    do: "option #{inspect(key)} must be #{expected}, got #{inspect(value)}"

  @doc "Renders the schema as a Markdown list for a moduledoc."
  @spec docs(schema()) :: String.t()
  def docs(schema) do
    Enum.map_join(schema, "\n", fn {key, spec} ->
      default =
        cond do
          spec[:required] -> " Required."
          Keyword.has_key?(spec, :default) -> " Default: `#{inspect(spec[:default])}`."
          true -> ""
        end

      "  * `#{inspect(key)}` — #{spec[:doc]}#{default}"
    end)
  end

  defp check_unknown(opts, known) do
    case Enum.find(opts, fn {key, _} -> key not in known end) do
      nil -> :ok
      {key, _} -> {:error, {:unknown, key, suggest(key, known)}}
    end
  end

  defp fetch(opts, key, spec) do
    case Keyword.fetch(opts, key) do
      {:ok, value} ->
        case check_type(value, spec[:type], spec[:max]) do
          :ok -> {:ok, value}
          {:error, expected} -> {:error, {:invalid, key, value, expected}}
        end

      :error ->
        cond do
          spec[:required] -> {:error, {:missing, key}}
          Keyword.has_key?(spec, :default) -> {:ok, spec[:default]}
          true -> :skip
        end
    end
  end

  defp check_type(v, :pos_integer, max) when is_integer(v) and v > 0, do: check_max(v, max)
  defp check_type(_, :pos_integer, max), do: {:error, "a positive integer" <> upto(max)}
  defp check_type(v, :non_neg_integer, max) when is_integer(v) and v >= 0, do: check_max(v, max)
  defp check_type(_, :non_neg_integer, max), do: {:error, "a non-negative integer" <> upto(max)}
  defp check_type(v, :boolean, _) when is_boolean(v), do: :ok
  defp check_type(_, :boolean, _), do: {:error, "a boolean"}
  defp check_type(v, :map, _) when is_map(v), do: :ok
  defp check_type(_, :map, _), do: {:error, "a map"}
  defp check_type(v, :string, _) when is_binary(v), do: :ok
  defp check_type(_, :string, _), do: {:error, "a string"}

  defp check_type(v, {:list, :string}, _) when is_list(v),
    do: if(Enum.all?(v, &is_binary/1), do: :ok, else: {:error, "a list of strings"})

  defp check_type(_, {:list, :string}, _), do: {:error, "a list of strings"}

  defp check_type(v, :keyword, _) when is_list(v),
    do: if(Keyword.keyword?(v), do: :ok, else: {:error, "a keyword list"})

  defp check_type(_, :keyword, _), do: {:error, "a keyword list"}
  defp check_type(_, :any, _), do: :ok
  defp check_type(v, {:in, values}, _), do: if(v in values, do: :ok, else: {:error, "one of #{inspect(values)}"})
  defp check_type(v, {:custom, fun}, _), do: fun.(v)

  defp check_max(_v, nil), do: :ok
  defp check_max(v, max) when v <= max, do: :ok
  defp check_max(_v, max), do: {:error, "an integer of at most #{max}"}

  defp upto(nil), do: ""
  defp upto(max), do: " of at most #{max}"
end
