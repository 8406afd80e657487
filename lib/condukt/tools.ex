defmodule Condukt.Tools do
  @moduledoc """
  The built-in tools. Each goes through the session's sandbox
  (`Condukt.Sandbox`), so it works the same against the host, a pod or your
  own backend, and its network traffic is subject to the sandbox's network
  policy.

  | tool | name | does |
  |------|------|------|
  | `Condukt.Tools.Read` | `Read` | reads a text file, optionally a range of lines |
  | `Condukt.Tools.Write` | `Write` | writes a whole file |
  | `Condukt.Tools.Edit` | `Edit` | replaces one exact occurrence of a text in a file |
  | `Condukt.Tools.Bash` | `Bash` | runs a shell command, returns its output and exit code |
  | `Condukt.Tools.Glob` | `Glob` | lists files matching a wildcard |
  | `Condukt.Tools.Grep` | `Grep` | searches file contents |

      defmodule MyApp.CodingAgent do
        use Condukt

        @impl true
        def tools, do: Condukt.Tools.coding_tools()
      end
  """

  @doc "Read, Write, Edit, Bash, Glob and Grep."
  @spec coding_tools() :: [module()]
  def coding_tools,
    do: [
      Condukt.Tools.Read,
      Condukt.Tools.Write,
      Condukt.Tools.Edit,
      Condukt.Tools.Bash,
      Condukt.Tools.Glob,
      Condukt.Tools.Grep
    ]

  @doc "Read, Glob and Grep: tools that cannot change anything."
  @spec read_only_tools() :: [module()]
  def read_only_tools, do: [Condukt.Tools.Read, Condukt.Tools.Glob, Condukt.Tools.Grep]
end
