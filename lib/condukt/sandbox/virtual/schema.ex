defmodule Condukt.Sandbox.Virtual.Schema do
  @moduledoc false
  # Option schemas of Condukt.Sandbox.Virtual. exec/glob/grep share Local's
  # keys and meaning, so an agent's calls work against either backend.

  alias Condukt.Sandbox.Local.Schema, as: Local

  @spec init() :: Condukt.Options.schema()
  def init do
    [
      cwd: [
        type: {:custom, &__MODULE__.absolute/1},
        default: "/workspace",
        doc: "the virtual directory relative paths resolve against and commands start in (created if missing)."
      ],
      mounts: [
        type: {:custom, &__MODULE__.mounts/1},
        default: [],
        doc:
          "host directories to show inside the sandbox, as `{host_path, sandbox_path, :readonly | :readwrite}` " <>
            "tuples."
      ],
      agent_mounts: [
        type: {:custom, &__MODULE__.agent_mounts/1},
        default: [],
        doc:
          "the host directories an agent may mount with `Condukt.Sandbox.Virtual.Tools.Mount`, as " <>
            "`{host_path, :readonly | :readwrite}`: a directory inside one of them, read-write only inside a " <>
            "`:readwrite` one. Empty: the tool mounts nothing."
      ],
      env: [
        type: {:custom, &Local.env/1},
        default: %{},
        doc: "environment variables of every command, as a map or a list of `{name, value}` string pairs."
      ],
      timeout: [type: :pos_integer, default: 120_000, doc: "the default `exec/3` wall-clock limit, in milliseconds."],
      max_output_bytes: [
        type: :pos_integer,
        default: 1_048_576,
        doc: "the default cap on the output `exec/3` keeps; the rest is dropped and a marker says how much."
      ],
      max_commands: [type: :pos_integer, default: 100_000, doc: "the most commands one `exec/3` may run."],
      max_loop_iterations: [type: :pos_integer, default: 100_000, doc: "the most iterations of any one loop."],
      max_total_loop_iterations: [
        type: :pos_integer,
        default: 1_000_000,
        doc: "the most loop iterations of one `exec/3`, all loops together."
      ],
      max_fs_bytes: [
        type: :pos_integer,
        default: 100_000_000,
        doc: "the most bytes the in-memory file system holds, all files together (mounts not counted)."
      ],
      max_file_bytes: [type: :pos_integer, default: 10_000_000, doc: "the largest in-memory file."],
      network_policy: [
        type: :any,
        default: nil,
        doc:
          "a `Condukt.Sandbox.NetworkPolicy`; without one, commands have no network at all. " <>
            "See \"Network policy\" below."
      ],
      ca_files: [
        type: {:list, :string},
        default: [],
        doc: "PEM files of extra roots that `curl` and `wget` trust, on top of the system's."
      ],
      allow_private_networks: [
        type: :boolean,
        default: false,
        doc:
          "let allowed requests reach loopback, private and link-local addresses even when no allow rule " <>
            "names the address (for tests against local servers)."
      ],
      resolve: [
        type: {:custom, &__MODULE__.resolve/1},
        default: %{},
        doc:
          "fixed addresses for host names, used instead of DNS, as a map of name to IP address string " <>
            "(as curl's `--resolve`; the policy still sees the name)."
      ],
      messages: [
        type: :any,
        default: nil,
        doc: "the session's message history, oldest first, for the context of decide rules."
      ],
      id: [type: :any, default: nil, doc: "the session id, reported in the network policy's events."]
    ]
  end

  @spec exec() :: Condukt.Options.schema()
  def exec do
    [
      timeout: [type: :pos_integer, doc: "the wall-clock limit for this command. Default: the sandbox's `:timeout`."],
      cwd: [
        type: {:custom, &Local.path/1},
        doc: "the directory to start in; a relative one resolves against the sandbox's `:cwd`."
      ],
      env: [
        type: {:custom, &Local.env/1},
        default: %{},
        doc: "environment variables for this command, layered over the sandbox's `:env`."
      ],
      max_output_bytes: [type: :pos_integer, doc: "the output cap for this command. Default: the sandbox's."]
    ]
  end

  @spec glob() :: Condukt.Options.schema()
  def glob, do: Local.glob()

  @spec grep() :: Condukt.Options.schema()
  def grep, do: Local.grep()

  @doc false
  def absolute("/" <> _ = path), do: if(String.contains?(path, <<0>>), do: {:error, "an absolute path"}, else: :ok)
  def absolute(_), do: {:error, "an absolute path string"}

  @doc false
  def resolve(map) when is_map(map) do
    if Enum.all?(map, fn {name, ip} ->
         is_binary(name) and is_binary(ip) and match?({:ok, _}, :inet.parse_strict_address(String.to_charlist(ip)))
       end),
       do: :ok,
       else: {:error, "a map of host name to IP address strings"}
  end

  def resolve(_), do: {:error, "a map of host name to IP address strings"}

  @doc false
  def agent_mounts(list) when is_list(list) do
    if Enum.all?(
         list,
         &match?({host, mode} when is_binary(host) and host != "" and mode in [:readonly, :readwrite], &1)
       ),
       do: :ok,
       else: {:error, "a list of {host_path, :readonly | :readwrite} tuples"}
  end

  def agent_mounts(_), do: {:error, "a list of {host_path, :readonly | :readwrite} tuples"}

  @doc false
  def mounts(list) when is_list(list) do
    if Enum.all?(list, &mount?/1),
      do: :ok,
      else: {:error, "a list of {host_path, sandbox_path, :readonly | :readwrite} tuples with an absolute sandbox_path"}
  end

  def mounts(_), do: {:error, "a list of {host_path, sandbox_path, :readonly | :readwrite} tuples"}

  defp mount?({host, "/" <> _, mode}) when is_binary(host) and host != "" and mode in [:readonly, :readwrite], do: true
  defp mount?(_), do: false
end
