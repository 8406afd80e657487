defmodule Condukt.Sandbox.Kubernetes.Names do
  @moduledoc false
  # The names, labels and annotations of docs/kubernetes.md, "Names": pure
  # functions of the session id.

  @managed_by "app.kubernetes.io/managed-by"
  @sandbox "condukt.dev/sandbox"
  @id "condukt.dev/id"
  @heartbeat "condukt.tuist.dev/heartbeat-at"
  # The name earlier versions wrote: still read by reap_stale/1.
  @legacy_heartbeat "condukt.dev/heartbeat"
  @delete_on_shutdown "condukt.dev/delete-on-shutdown"

  def managed_by_label, do: @managed_by
  def sandbox_label, do: @sandbox
  def id_annotation, do: @id
  def heartbeat_annotation, do: @heartbeat
  def legacy_heartbeat_annotation, do: @legacy_heartbeat
  def delete_on_shutdown_annotation, do: @delete_on_shutdown

  @doc "The first 10 hex digits of SHA-256(id)."
  @spec hash(String.t()) :: String.t()
  def hash(id) when is_binary(id),
    do: :crypto.hash(:sha256, id) |> Base.encode16(case: :lower) |> binary_part(0, 10)

  @doc "`condukt-<slug>-<hash>`, a DNS-1123 label of at most 63 characters."
  @spec pod_name(String.t()) :: String.t()
  def pod_name(id) when is_binary(id) do
    case slug(id) do
      "" -> "condukt-" <> hash(id)
      slug -> "condukt-#{slug}-#{hash(id)}"
    end
  end

  defp slug(id) do
    id
    |> String.downcase()
    |> String.replace(~r/[^a-z0-9]+/u, "-")
    |> String.replace(~r/[^a-z0-9-]/, "-")
    |> String.trim("-")
    |> binary_part_safe(40)
    |> String.trim("-")
  end

  defp binary_part_safe(s, n) when byte_size(s) <= n, do: s
  defp binary_part_safe(s, n), do: binary_part(s, 0, n)

  def egress_secret(pod), do: pod <> "-egress"
  def trust_secret(pod), do: pod <> "-trust"
  def network_policy(pod), do: pod <> "-egress"

  @doc "The two labels every object carries; the selector of cleanup."
  @spec selector_labels(String.t()) :: %{String.t() => String.t()}
  def selector_labels(id), do: %{@managed_by => "condukt", @sandbox => hash(id)}

  @doc "The pod's labels: the caller's, then ours (ours win)."
  @spec pod_labels(String.t(), map()) :: %{String.t() => String.t()}
  def pod_labels(id, extra), do: Map.merge(stringify(extra), selector_labels(id))

  @spec pod_annotations(String.t(), boolean(), DateTime.t(), map()) :: %{String.t() => String.t()}
  def pod_annotations(id, delete_on_shutdown?, now, extra) do
    Map.merge(stringify(extra), %{
      @id => id,
      @heartbeat => timestamp(now),
      @delete_on_shutdown => to_string(delete_on_shutdown?)
    })
  end

  @doc "RFC 3339, UTC, second precision."
  @spec timestamp(DateTime.t()) :: String.t()
  def timestamp(%DateTime{} = t),
    do: t |> DateTime.shift_zone!("Etc/UTC") |> DateTime.truncate(:second) |> DateTime.to_iso8601()

  def stringify(map), do: Map.new(map, fn {k, v} -> {to_string(k), to_string(v)} end)
end
