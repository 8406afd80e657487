defmodule Condukt.Sandbox.NetworkPolicy.ControlBridge.Options do
  @moduledoc false
  # The ControlBridge's option schema (Condukt.Options), shared by
  # validation and the rendered "## Options" section of its moduledoc.

  alias Condukt.Sandbox.NetworkPolicy

  @spec schema() :: Condukt.Options.schema()
  def schema do
    [
      session_id: [
        type: {:custom, &session_id/1},
        required: true,
        doc: "the gated session's id (1 to 256 bytes); the sidecar must prove it gates this one."
      ],
      owner: [
        type: {:custom, &pid/1},
        required: true,
        doc: "the session's process; the bridge monitors it and stops `:normal` when it goes."
      ],
      policy: [
        type: {:custom, &policy/1},
        required: true,
        doc: "the session's `Condukt.Sandbox.NetworkPolicy` (its decide rules run here)."
      ],
      address: [
        type: {:custom, &address/1},
        required: true,
        doc:
          "the sidecar's control address: `\"unix:/path\"`, `\"127.0.0.1:PORT\"`, " <>
            "`\"[::1]:PORT\"`, `{:unix, path}` or `{:tcp, host, port}`."
      ],
      token: [
        type: {:custom, &token/1},
        required: true,
        doc: "the session's control token as lowercase hex (32 to 256 digits)."
      ],
      messages: [
        type: {:custom, &messages/1},
        default: nil,
        doc:
          "the session's message history for the deciders' context, oldest first: a list, " <>
            "a 0-arity function or `{m, f, a}` (called in the decider's task); `nil` for none."
      ],
      backoff: [
        type: {:custom, &backoff/1},
        default: {200, 10_000},
        doc: "`{initial_ms, max_ms}` of the capped exponential backoff between dial attempts."
      ],
      attempts: [
        type: {:custom, &attempts/1},
        default: 10,
        doc:
          "consecutive failed dial attempts after which the bridge gives up (stops `:normal`); `:infinity` " <>
            "never gives up (the Kubernetes backend: a kubelet or API server outage of any length ends in a re-dial)."
      ],
      attach_timeout: [
        type: :pos_integer,
        default: 5_000,
        doc: "milliseconds one dial may take to connect and receive the sidecar's welcome."
      ],
      window: [
        type: :pos_integer,
        max: 65_536,
        default: 256,
        doc: "frame credit: how many frames the port may deliver before the bridge acknowledges them."
      ],
      ping_interval: [
        type: {:custom, &ping_interval/1},
        default: nil,
        doc:
          "milliseconds of silence on a connected channel after which the bridge sends a `ping`; when no frame " <>
            "follows within `:ping_timeout` the channel is taken as dead, closed and re-dialled. For transports that " <>
            "may not report a drop (a port-forward tunnel). `nil`: no pings."
      ],
      ping_timeout: [
        type: :pos_integer,
        default: 10_000,
        doc: "milliseconds to wait for any frame after a `ping` (see `:ping_interval`)."
      ],
      native: [
        type: :keyword,
        default: [],
        doc: "options for the bridge's `Condukt.Native` (`:bin`: the `condukt-egress` executable)."
      ]
    ]
  end

  @doc "Validates and normalises (policy to a struct, address to a tuple)."
  @spec validate(term()) :: {:ok, keyword()} | {:error, Condukt.Options.Error.t()}
  def validate(opts) when is_list(opts) do
    if Keyword.keyword?(opts) do
      case Condukt.Options.validate(opts, schema()) do
        {:ok, opts} ->
          {:ok,
           opts
           |> Keyword.update!(:policy, &NetworkPolicy.new!/1)
           |> Keyword.update!(:address, &parse_address/1)}

        {:error, error} ->
          {:error, Condukt.Options.Error.exception_for(error, "ControlBridge")}
      end
    else
      not_keyword(opts)
    end
  end

  def validate(opts), do: not_keyword(opts)

  defp not_keyword(opts) do
    {:error,
     %Condukt.Options.Error{reason: :invalid, where: "ControlBridge", key: :opts, value: opts, detail: "a keyword list"}}
  end

  @doc "`\"unix:/p\"`, `\"host:port\"`, `\"[v6]:port\"` or a tuple, to the port's address tuple."
  @spec parse_address(term()) :: Condukt.Native.address() | :error
  def parse_address({:unix, path}) when is_binary(path) and path != "", do: {:unix, path}

  def parse_address({:tcp, host, port}) when is_binary(host) and host != "" and is_integer(port) and port in 1..65_535,
    do: {:tcp, host, port}

  def parse_address("unix:" <> path) when path != "", do: {:unix, path}

  def parse_address(text) when is_binary(text) do
    captured =
      Regex.run(~r/\A\[([0-9A-Fa-f:.]+)\]:(\d{1,5})\z/, text, capture: :all_but_first) ||
        Regex.run(~r/\A([^:\[\]\/\s]+):(\d{1,5})\z/, text, capture: :all_but_first)

    with [host, port] <- captured,
         port = String.to_integer(port),
         true <- port in 1..65_535 do
      {:tcp, host, port}
    else
      _ -> :error
    end
  end

  def parse_address(_), do: :error

  defp session_id(v) when is_binary(v) and byte_size(v) in 1..256, do: :ok
  defp session_id(_), do: {:error, "a non-empty string of at most 256 bytes"}

  defp pid(v) when is_pid(v), do: :ok
  defp pid(_), do: {:error, "a pid"}

  defp policy(v) do
    case NetworkPolicy.new(v) do
      {:ok, _} -> :ok
      {:error, error} -> {:error, "a valid network policy (#{Exception.message(error)})"}
    end
  end

  defp address(v) do
    if parse_address(v) == :error,
      do: {:error, "\"unix:/path\", \"host:port\", \"[v6]:port\", {:unix, path} or {:tcp, host, port}"},
      else: :ok
  end

  defp token(v) when is_binary(v) and byte_size(v) in 32..256 and rem(byte_size(v), 2) == 0 do
    if v =~ ~r/\A[0-9a-f]+\z/, do: :ok, else: token(nil)
  end

  defp token(_), do: {:error, "lowercase hex of 32 to 256 digits"}

  defp messages(nil), do: :ok
  defp messages(v) when is_list(v) or is_function(v, 0), do: :ok
  defp messages({m, f, a}) when is_atom(m) and is_atom(f) and is_list(a), do: :ok
  defp messages(_), do: {:error, "nil, a list, a 0-arity function or {m, f, a}"}

  defp ping_interval(nil), do: :ok
  defp ping_interval(v) when is_integer(v) and v > 0, do: :ok
  defp ping_interval(_), do: {:error, "a positive integer (milliseconds) or nil"}

  defp attempts(:infinity), do: :ok
  defp attempts(v) when is_integer(v) and v > 0, do: :ok
  defp attempts(_), do: {:error, "a positive integer or :infinity"}

  defp backoff({initial, max}) when is_integer(initial) and is_integer(max) and initial > 0 and max >= initial,
    do: :ok

  defp backoff(_), do: {:error, "{initial_ms, max_ms} with 0 < initial_ms <= max_ms"}
end
