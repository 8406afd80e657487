defmodule Condukt.Native.Error do
  @moduledoc """
  A call to the `condukt-egress port` program that did not succeed.

  `:code` is the port's error name (`:inval`, `:io`, `:timedout`,
  `:closed`, `:unavail`, `:proto`, `:badarg`, …; docs/port-protocol.md) or
  one of the BEAM side's own:

  | code | meaning |
  |------|---------|
  | `:port_exited` | the port program exited (or was killed) before it answered |
  | `:bad_reply` | the port answered with a term outside the protocol |

  `:op` is the operation that failed (`:version`, `:control_attach`, …) and
  `:message` the port's own sentence, which names the bad input.
  """

  @type t :: %__MODULE__{code: atom(), message: String.t(), op: atom() | nil}

  defexception [:code, :message, :op]

  @impl true
  def message(%__MODULE__{code: code, message: message, op: op}) do
    where = if op, do: "condukt-egress port #{op}", else: "condukt-egress port"
    "#{where} failed (#{code}): #{message}"
  end
end
