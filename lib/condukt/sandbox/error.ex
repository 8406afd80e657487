defmodule Condukt.Sandbox.Error do
  @moduledoc """
  A sandbox operation that failed.

  Every `{:error, _}` the `Condukt.Sandbox` facade returns holds one of these,
  except `{:error, :not_supported}` (an optional callback the sandbox does
  not implement), which stays a bare atom so callers can match it directly.

  `:op` names the facade operation (`:new`, `:read`, `:write`, `:edit`,
  `:exec`, `:glob`, `:grep`, `:mount`, `:shutdown`), `:path` the path (or
  pattern, or command directory) it was about, as the caller wrote it, and
  `:detail` carries reason-specific data. `message/1` renders a sentence that
  an agent can act on.

  | reason                  | meaning |
  |-------------------------|---------|
  | a `t:File.posix/0` atom | the filesystem refused (`:enoent`, `:eacces`, `:eisdir`, …) |
  | `:invalid_path`         | the path cannot name a file (it contains a NUL byte) |
  | `:empty_old_text`       | `edit/4` was given an empty `old_text` |
  | `:old_text_not_found`   | `edit/4`: `old_text` does not occur in the file |
  | `:old_text_not_unique`  | `edit/4`: `old_text` occurs more than once (`:detail` is the count) |
  | `:timeout`              | `exec/3` ran past its timeout and was killed (`:detail` holds `:timeout` and the partial `:output`) |
  | `:invalid_command`      | `exec/3`: the command contains a NUL byte |
  | `:spawn_failed`         | `exec/3`: the shell could not be started (`:detail` says why) |
  | `:invalid_pattern`      | `glob/3` or `grep/3`: the pattern does not compile (`:detail` says why) |
  | `:invalid_option`       | an unknown or ill-typed option (`:detail` is a `t:Condukt.Options.error/0`) |
  | `:invalid_network_policy` | the `:network_policy` option was refused (`:detail` is a `Condukt.Sandbox.NetworkPolicy.Error`) |
  | `:network_policy_unenforceable` | the policy cannot be enforced here and `network_policy_required: true` (`:detail` is a `Condukt.Sandbox.Local.NetworkError`) |
  | `:not_available`        | `Condukt.Sandbox.Virtual`: its native library is not built or not loadable (`:detail` says how to build it) |
  | `:limit_exceeded`       | `Condukt.Sandbox.Virtual`'s `exec/3` ran past a resource limit (`:detail` holds the `:message` and the partial `:output`) |
  | `:mount_failed`         | `mount/3` could not mount the host directory (`:detail` says why) |
  | `:invalid_sandbox`      | `new/2` was given something that is not a sandbox module (`:detail` says why) |
  | `:exception`            | a sandbox callback raised (`:detail` is the exception) |
  | `:bad_return`           | a sandbox callback returned a value outside its contract (`:detail` is the value) |
  | `:backend`              | a custom sandbox returned a non-atom error term (`:detail` is the term) |

  A custom sandbox that returns `{:error, some_atom}` gets `some_atom` as the
  reason.
  """

  @type reason ::
          File.posix()
          | :invalid_path
          | :empty_old_text
          | :old_text_not_found
          | :old_text_not_unique
          | :timeout
          | :invalid_command
          | :spawn_failed
          | :invalid_pattern
          | :invalid_option
          | :invalid_network_policy
          | :network_policy_unenforceable
          | :not_available
          | :limit_exceeded
          | :mount_failed
          | :invalid_sandbox
          | :exception
          | :bad_return
          | :backend
          | atom()

  @type op :: :new | :shutdown | :read | :write | :edit | :exec | :glob | :grep | :mount

  @type t :: %__MODULE__{reason: reason(), op: op() | nil, path: String.t() | nil, detail: term()}

  defexception [:reason, :op, :path, :detail]

  @impl true
  def message(%__MODULE__{} = error), do: prefix(error) <> what(error)

  defp prefix(%{op: nil}), do: "sandbox: "
  defp prefix(%{op: :new, path: nil}), do: "could not start the sandbox: "
  defp prefix(%{op: :new, path: dir}), do: "could not start the sandbox in #{inspect(dir)}: "
  defp prefix(%{op: :shutdown}), do: "could not shut the sandbox down: "
  defp prefix(%{op: :exec, path: nil}), do: "could not run the command: "
  defp prefix(%{op: :exec, path: dir}), do: "could not run the command in #{inspect(dir)}: "
  defp prefix(%{op: op, path: nil}), do: "could not #{op}: "
  defp prefix(%{op: op, path: path}), do: "could not #{op} #{inspect(path)}: "

  defp what(%{reason: :invalid_path}), do: "a path cannot contain a NUL byte"
  defp what(%{reason: :empty_old_text}), do: "old_text is empty; give the exact text to replace"

  defp what(%{reason: :old_text_not_found}),
    do: "old_text was not found in the file; read the file again and copy the text exactly, whitespace included"

  defp what(%{reason: :old_text_not_unique, detail: count}),
    do:
      "old_text occurs #{count} times in the file; include more of the surrounding lines so that it matches " <>
        "exactly once"

  defp what(%{reason: :timeout, detail: %{timeout: ms}}),
    do: "the command timed out after #{ms} ms and its processes were killed"

  defp what(%{reason: :timeout, detail: text}) when is_binary(text), do: text
  defp what(%{reason: :timeout}), do: "the operation timed out"
  defp what(%{reason: :invalid_command}), do: "a command cannot contain a NUL byte"
  defp what(%{reason: :spawn_failed, detail: detail}), do: "the shell could not be started (#{describe(detail)})"
  defp what(%{reason: :invalid_pattern, detail: detail}), do: "invalid pattern (#{describe(detail)})"
  defp what(%{reason: :invalid_option, detail: detail}), do: option_error(detail)
  defp what(%{reason: :invalid_network_policy, detail: detail}), do: describe(detail)

  defp what(%{reason: :network_policy_unenforceable, detail: detail}),
    do: "the network policy cannot be enforced: " <> describe(detail)

  defp what(%{reason: :not_available, detail: detail}),
    do: "the Virtual sandbox is not available: " <> describe(detail)

  defp what(%{reason: :limit_exceeded, detail: %{message: message}}),
    do: "the command ran past a resource limit and was stopped (#{message})"

  defp what(%{reason: :mount_failed, detail: detail}), do: "the mount failed (#{describe(detail)})"
  defp what(%{reason: :invalid_sandbox, detail: detail}), do: describe(detail)
  defp what(%{reason: :exception, detail: detail}), do: "the sandbox raised: " <> describe(detail)

  defp what(%{reason: :bad_return, detail: value}),
    do: "the sandbox returned a value outside its contract: #{inspect(value)}"

  defp what(%{reason: :backend, detail: detail}), do: describe(detail)

  defp what(%{reason: reason}) when is_atom(reason) do
    case :file.format_error(reason) do
      ~c"unknown POSIX error" ++ _ -> inspect(reason)
      text -> "#{text} (#{reason})"
    end
  end

  defp option_error({:unknown, key, nil}), do: "unknown option #{inspect(key)}"
  defp option_error({:unknown, key, hint}), do: "unknown option #{inspect(key)} (did you mean #{inspect(hint)}?)"
  defp option_error({:missing, key}), do: "the option #{inspect(key)} is required"

  defp option_error({:invalid, key, value, expected}),
    do: "expected the option #{inspect(key)} to be #{expected}, got: #{inspect(value)}"

  defp option_error(other), do: "invalid options: #{describe(other)}"

  defp describe(text) when is_binary(text), do: text
  defp describe(exception) when is_exception(exception), do: Exception.message(exception)
  defp describe(other), do: inspect(other)
end
