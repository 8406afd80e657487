defmodule Condukt do
  @moduledoc """
  Sandboxes for AI-agent sessions, with an egress network policy enforced by
  a native sidecar (`condukt-egress`).

  Start with `Condukt.Sandbox.NetworkPolicy` for policies; `docs/` describes
  the native core and its wire formats.
  """

  @doc """
  The path of the `condukt-egress` binary built into this application's
  `priv/` directory.
  """
  @spec egress_binary() :: Path.t()
  def egress_binary, do: Application.app_dir(:condukt, "priv/condukt-egress")
end
