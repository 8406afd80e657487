defmodule Condukt.Sandbox.NetworkPolicy.CA do
  @moduledoc """
  Trust for the per-session CA: the system
  bundle a sandbox mounts over the OS trust store is the Mozilla public CA
  list shipped in `priv/ca-certificates/mozilla.pem` followed by the
  session CA, so clients that read the OS store directly see both.
  """

  @doc "The path of the Mozilla root snapshot shipped with the library."
  @spec mozilla_path() :: Path.t()
  def mozilla_path, do: Application.app_dir(:condukt, "priv/ca-certificates/mozilla.pem")

  @doc """
  The trust bundle for a session: the Mozilla roots, then `ca_pem` (the
  session CA certificate, PEM). A newline separates them when the
  snapshot does not end in one.
  """
  @spec trust_bundle(String.t()) :: String.t()
  def trust_bundle(ca_pem) when is_binary(ca_pem) do
    mozilla = File.read!(mozilla_path())
    sep = if mozilla == "" or String.ends_with?(mozilla, "\n"), do: "", else: "\n"
    mozilla <> sep <> ca_pem
  end
end
