defmodule Condukt.Sandbox.Local.Schema do
  @moduledoc false
  # Option schemas of Condukt.Sandbox.Local, in one place so that validation
  # and the rendered docs cannot disagree (see Condukt.Options).

  @spec init() :: Condukt.Options.schema()
  def init do
    [
      cwd: [
        type: {:custom, &__MODULE__.path/1},
        doc:
          "the directory relative paths resolve against and commands start in. " <>
            "Default: the BEAM's current directory (`File.cwd!/0`) at `init/1`."
      ],
      env: [
        type: {:custom, &__MODULE__.env/1},
        default: %{},
        doc:
          "environment variables added to every command, as a map or a list of `{name, value}` " <>
            "string pairs; a `nil` value unsets a variable inherited from the BEAM. They reach the " <>
            "command's own shell only, never the programs that start it as the BEAM (so `BASH_ENV` or " <>
            "`LD_PRELOAD` naming a file the command can write is safe); exported bash functions " <>
            "(`BASH_FUNC_*`) are not passed."
      ],
      timeout: [type: :pos_integer, default: 120_000, doc: "the default `exec/3` timeout, in milliseconds."],
      max_output_bytes: [
        type: :pos_integer,
        default: 1_048_576,
        doc: "the default cap on the output `exec/3` keeps; the rest is dropped and a marker says how much."
      ],
      network_policy: [
        type: :any,
        default: nil,
        doc:
          "a `Condukt.Sandbox.NetworkPolicy` (struct, keyword list or map). It is validated and kept in the " <>
            "sandbox state; see \"Network policy\" below."
      ],
      network_policy_required: [
        type: :boolean,
        default: false,
        doc:
          "make `init/1` fail when the `:network_policy` cannot be enforced on this machine " <>
            "(instead of one warning and unenforced commands)."
      ],
      network: [
        type: :keyword,
        default: [],
        doc:
          "options of the enforcement plane (`Condukt.Sandbox.Local.Network`): `:uplink`, `:hosts`, `:dns`, " <>
            "`:allow_private`, `:upstream_ca`, `:user` (the commands' uid; default 65534, which " <>
            "should own `:cwd`), `:sidecar_uid`, `:proxy_args`, `:binary`."
      ],
      messages: [
        type: :any,
        default: nil,
        doc:
          "the session's message history, oldest first, for the context of decide rules: a list, " <>
            "a 0-arity function or `{m, f, a}`."
      ],
      id: [
        type: :any,
        default: nil,
        doc: "the session id; with a network policy it is the id the sidecar reports."
      ]
    ]
  end

  @spec exec() :: Condukt.Options.schema()
  def exec do
    [
      timeout: [
        type: :pos_integer,
        doc: "milliseconds before the command's processes are killed. Default: the sandbox's `:timeout`."
      ],
      cwd: [
        type: {:custom, &__MODULE__.path/1},
        doc: "the directory to start in; a relative one resolves against the sandbox's `:cwd`."
      ],
      env: [
        type: {:custom, &__MODULE__.env/1},
        default: %{},
        doc: "environment variables for this command, layered over the sandbox's `:env`."
      ],
      max_output_bytes: [type: :pos_integer, doc: "the output cap for this command. Default: the sandbox's."]
    ]
  end

  @spec glob() :: Condukt.Options.schema()
  def glob do
    [
      match_dot: [type: :boolean, default: false, doc: "whether `*`, `?` and `**` match names that start with a dot."],
      max_results: [type: :pos_integer, default: 1_000, doc: "how many paths to return at most (the first, sorted)."]
    ]
  end

  @spec grep() :: Condukt.Options.schema()
  def grep do
    [
      path: [
        type: {:custom, &__MODULE__.path/1},
        default: ".",
        doc: "the file or directory to search; a directory is searched recursively."
      ],
      glob: [
        type: :string,
        doc: "only search files matching this wildcard, relative to `:path` (for example `\"**/*.ex\"`)."
      ],
      literal: [type: :boolean, default: false, doc: "treat the pattern as plain text, not a regular expression."],
      ignore_case: [type: :boolean, default: false, doc: "match letters case-insensitively."],
      hidden: [type: :boolean, default: false, doc: "also search files and directories whose names start with a dot."],
      max_matches: [type: :pos_integer, default: 1_000, doc: "stop after this many matching lines."]
    ]
  end

  @doc false
  def path(value) when is_binary(value) and value != "", do: :ok
  def path(_), do: {:error, "a non-empty path string"}

  @doc false
  def env(env) when is_map(env) or is_list(env) do
    if Enum.all?(env, &env_pair?/1),
      do: :ok,
      else: {:error, "a map or list of {name, value} strings (names without \"=\" or NUL, values without NUL, or nil)"}
  end

  def env(_), do: {:error, "a map or list of {name, value} strings"}

  defp env_pair?({name, value}) when is_binary(name) and (is_binary(value) or is_nil(value)) do
    name != "" and not String.contains?(name, ["=", <<0>>]) and
      not (is_binary(value) and String.contains?(value, <<0>>))
  end

  defp env_pair?(_), do: false
end
