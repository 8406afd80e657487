defmodule Condukt.Sandbox.Backend do
  @moduledoc false
  # Helpers every built-in sandbox shares, so that Local, Kubernetes and
  # Virtual refuse bad options and bad policies in the same words.

  alias Condukt.Options
  alias Condukt.Sandbox.{Error, NetworkPolicy}

  @doc "Validates a call's options against its schema; `op` names the facade operation."
  @spec validate(term(), Options.schema(), Error.op()) :: {:ok, keyword()} | {:error, Error.t()}
  def validate(opts, schema, op) do
    if is_list(opts) and Keyword.keyword?(opts) do
      case Options.validate(opts, schema) do
        {:ok, opts} -> {:ok, opts}
        {:error, error} -> {:error, %Error{reason: :invalid_option, op: op, detail: error}}
      end
    else
      {:error, %Error{reason: :invalid_option, op: op, detail: "expected a keyword list, got: #{inspect(opts)}"}}
    end
  end

  @doc "The `:network_policy` init option, validated (`nil` stays `nil`)."
  @spec network_policy(term()) :: {:ok, NetworkPolicy.t() | nil} | {:error, Error.t()}
  def network_policy(nil), do: {:ok, nil}

  def network_policy(policy) do
    case NetworkPolicy.new(policy) do
      {:ok, policy} -> {:ok, policy}
      {:error, error} -> {:error, %Error{reason: :invalid_network_policy, op: :new, detail: error}}
    end
  end

  @doc """
  The values of the policy's secrets (`NetworkPolicy.Credentials.values/1`),
  resolved when a sandbox starts; `%{}` without a policy or credentials.
  """
  @spec credential_values(NetworkPolicy.t() | nil) :: {:ok, %{String.t() => String.t()}} | {:error, Error.t()}
  def credential_values(%NetworkPolicy{secrets: secrets}) when map_size(secrets) > 0 do
    case NetworkPolicy.Credentials.values(secrets) do
      {:ok, values} -> {:ok, values}
      {:error, error} -> {:error, %Error{reason: :invalid_network_policy, op: :new, detail: error}}
    end
  end

  def credential_values(_policy), do: {:ok, %{}}

  @doc """
  The bridge's half of `NetworkPolicy.rotate_credential/3`, once the
  backend replaced the sidecar's stored copy.
  """
  @spec rotate_in_sidecar(pid() | nil, String.t(), String.t()) :: :ok | {:error, NetworkPolicy.Error.t()}
  def rotate_in_sidecar(nil, name, _value),
    do: {:error, %NetworkPolicy.Error{reason: :rotation_failed, key: :secrets, value: name, detail: "no sidecar runs"}}

  def rotate_in_sidecar(bridge, name, value) do
    case NetworkPolicy.ControlBridge.rotate_credential(bridge, name, value) do
      :ok ->
        :ok

      {:error, :timeout} ->
        {:error,
         %NetworkPolicy.Error{
           reason: :rotation_failed,
           key: :secrets,
           value: name,
           detail: "the sidecar did not confirm in time; it takes the value when its control channel is back"
         }}
    end
  end

  @doc "Refuses a command that cannot be passed to a shell (it contains a NUL byte)."
  @spec check_command(String.t()) :: :ok | {:error, Error.t()}
  def check_command(command) do
    if String.contains?(command, <<0>>),
      do: {:error, %Error{reason: :invalid_command, op: :exec}},
      else: :ok
  end

  @doc "`Condukt.Sandbox.Edit.replace_once/3` with its refusals as `edit/4` errors about `path`."
  @spec replace_once(binary(), binary(), binary(), String.t()) :: {:ok, binary()} | {:error, Error.t()}
  def replace_once(content, old_text, new_text, path) do
    case Condukt.Sandbox.Edit.replace_once(content, old_text, new_text) do
      {:ok, updated} ->
        {:ok, IO.iodata_to_binary(updated)}

      {:error, {:old_text_not_unique, n}} ->
        {:error, %Error{reason: :old_text_not_unique, op: :edit, path: path, detail: n}}

      {:error, reason} ->
        {:error, %Error{reason: reason, op: :edit, path: path}}
    end
  end
end
