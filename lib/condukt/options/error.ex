defmodule Condukt.Options.Error do
  @moduledoc """
  Options that a `Condukt.Options` schema refused.

  `:reason` is `:unknown` (a key the schema does not define; `:detail`
  holds the closest known key, if any), `:missing` (a required key) or
  `:invalid` (`:value` is not what `:detail` describes). `:where` names
  what was being configured (`"ControlBridge"`), `:key` the option.
  """

  @type t :: %__MODULE__{
          reason: :unknown | :missing | :invalid,
          where: String.t(),
          key: term(),
          value: term(),
          detail: term()
        }

  defexception [:reason, :where, :key, :value, :detail]

  @doc "The error for a `Condukt.Options.validate/2` failure."
  @spec exception_for(Condukt.Options.error(), String.t()) :: t()
  def exception_for({:unknown, key, suggestion}, where),
    do: %__MODULE__{reason: :unknown, where: where, key: key, value: key, detail: suggestion}

  def exception_for({:missing, key}, where), do: %__MODULE__{reason: :missing, where: where, key: key}

  def exception_for({:invalid, key, value, expected}, where),
    do: %__MODULE__{reason: :invalid, where: where, key: key, value: value, detail: expected}

  @impl true
  def message(%__MODULE__{reason: :unknown, where: where, key: key, detail: nil}),
    do: "#{where}: unknown option #{inspect(key)}"

  def message(%__MODULE__{reason: :unknown, where: where, key: key, detail: hint}),
    do: "#{where}: unknown option #{inspect(key)} (did you mean #{inspect(hint)}?)"

  def message(%__MODULE__{reason: :missing, where: where, key: key}),
    do: "#{where}: the option #{inspect(key)} is required"

  def message(%__MODULE__{reason: :invalid, where: where, key: key, value: value, detail: expected}),
    do: "#{where}: expected option #{inspect(key)} to be #{expected}, got: #{inspect(value, limit: 20)}"
end
