defmodule Condukt.Sandbox.Local.NetworkError do
  @moduledoc """
  Why `Condukt.Sandbox.Local` could not enforce a network policy.

  | reason | meaning |
  |--------|---------|
  | `:unsupported_os` | not Linux: there are no network namespaces to put the session in |
  | `:not_privileged` | the BEAM lacks a capability the enforcement needs (`:detail` names which) |
  | `:missing_tool` | a program the enforcement needs is not installed (`:detail` is its name) |
  | `:untrusted_path` | a program or file the BEAM would run or trust with its privileges could be replaced by someone other than root (`:detail` says which and why) |
  | `:invalid_option` | a network option has a bad value (`:detail` says which and why) |
  | `:command_failed` | setting the namespace up failed (`:detail` is the command and its output) |
  | `:sidecar_failed` | the sidecar did not start (`:detail` is its stderr) |
  """

  @type reason ::
          :unsupported_os
          | :not_privileged
          | :missing_tool
          | :untrusted_path
          | :invalid_option
          | :command_failed
          | :sidecar_failed

  @type t :: %__MODULE__{reason: reason(), detail: term()}

  defexception [:reason, :detail]

  @impl true
  def message(%__MODULE__{reason: :unsupported_os, detail: os}),
    do: "network policy enforcement needs Linux network namespaces; this is #{inspect(os)}"

  def message(%__MODULE__{reason: :not_privileged, detail: caps}),
    do:
      "network policy enforcement needs #{Enum.join(List.wrap(caps), " and ")} " <>
        "(run the BEAM as root, or grant the capabilities)"

  def message(%__MODULE__{reason: :missing_tool, detail: tool}),
    do: "network policy enforcement needs `#{tool}`, which is not installed (Debian: iproute2, util-linux, iptables)"

  def message(%__MODULE__{reason: :untrusted_path, detail: detail}),
    do:
      "network policy enforcement refuses to run or trust a file that someone other than root " <>
        "could replace (a session could then act with the BEAM's privileges): #{detail}"

  def message(%__MODULE__{reason: :invalid_option, detail: detail}), do: "invalid network option: #{detail}"

  def message(%__MODULE__{reason: :command_failed, detail: {argv, status, output}}),
    do: "setting up the session's network failed: `#{Enum.join(argv, " ")}` exited #{status}: #{String.trim(output)}"

  def message(%__MODULE__{reason: :sidecar_failed, detail: detail}),
    do: "the egress sidecar did not start: #{String.trim(to_string(detail))}"
end
