defmodule Condukt.Kube.Conn do
  @moduledoc """
  Explicit connection fields for `Condukt.Kube` (the `:conn` option):
  when given, no kubeconfig or in-cluster file is read.

      %Condukt.Kube.Conn{server: "https://10.0.0.1:6443", ca_pem: ca, token: token}

  `:server` is required (`https://host:port`). The server certificate is
  checked against `:ca_pem` unless `insecure: true`. Authenticate with
  `:token`, `:token_file` (re-read when it changes) or
  `:client_cert_pem` + `:client_key_pem`.
  """

  @fields [:server, :ca_pem, :insecure, :token, :token_file, :client_cert_pem, :client_key_pem]

  @type t :: %__MODULE__{
          server: String.t(),
          ca_pem: String.t() | nil,
          insecure: boolean(),
          token: String.t() | nil,
          token_file: Path.t() | nil,
          client_cert_pem: String.t() | nil,
          client_key_pem: String.t() | nil
        }

  @enforce_keys [:server]
  defstruct server: nil,
            ca_pem: nil,
            insecure: false,
            token: nil,
            token_file: nil,
            client_cert_pem: nil,
            client_key_pem: nil

  @doc """
  Builds a connection from a struct, keyword list or map of the fields
  above. Unknown keys and ill-typed values are refused, naming them.
  """
  @spec new(t() | keyword() | map()) :: {:ok, t()} | {:error, String.t()}
  def new(%__MODULE__{} = conn), do: check(conn)

  def new(fields) when is_list(fields) or is_map(fields) do
    if is_list(fields) and not Keyword.keyword?(fields) do
      {:error, "expected a Condukt.Kube.Conn, a keyword list or a map, got: #{inspect(fields)}"}
    else
      case Enum.find(fields, fn {k, _} -> k not in @fields end) do
        nil ->
          fields = Map.new(fields)

          if Map.has_key?(fields, :server),
            do: check(struct(__MODULE__, fields)),
            else: {:error, "the connection field :server is required"}

        {k, _} ->
          {:error, "unknown connection field #{inspect(k)} (known: #{Enum.map_join(@fields, ", ", &inspect/1)})"}
      end
    end
  end

  def new(other), do: {:error, "expected a Condukt.Kube.Conn, a keyword list or a map, got: #{inspect(other)}"}

  defp check(%__MODULE__{} = c) do
    cond do
      not (is_binary(c.server) and String.starts_with?(c.server, ["https://", "http://"])) ->
        {:error, "the connection field :server must be an https:// URL, got: #{inspect(c.server)}"}

      not is_boolean(c.insecure) ->
        {:error, "the connection field :insecure must be a boolean, got: #{inspect(c.insecure)}"}

      bad = Enum.find([:ca_pem, :token, :token_file, :client_cert_pem, :client_key_pem], &bad_string?(c, &1)) ->
        {:error, "the connection field #{inspect(bad)} must be a string, got: #{inspect(Map.get(c, bad))}"}

      is_nil(c.client_cert_pem) != is_nil(c.client_key_pem) ->
        {:error, "the connection fields :client_cert_pem and :client_key_pem go together"}

      true ->
        {:ok, c}
    end
  end

  defp bad_string?(c, key) do
    value = Map.get(c, key)
    not (is_nil(value) or is_binary(value))
  end

  @doc false
  # The port's `kube_open` map (docs/port-protocol.md, "Kubernetes").
  @spec to_source(t()) :: map()
  def to_source(%__MODULE__{} = c) do
    c
    |> Map.from_struct()
    |> Enum.reject(fn {k, v} -> is_nil(v) or (k == :insecure and v == false) end)
    |> Map.new()
    |> Map.put(:source, :explicit)
  end
end
