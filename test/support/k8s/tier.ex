defmodule Condukt.Test.K8s.Tier do
  @moduledoc false
  # Decides whether the `:kubernetes` tier can run on this machine
  # (docs/k8s-tier.md).
  #
  # The tier needs the binaries of scripts/k8s/binaries.sh (the control
  # plane, the kubelet, kube-proxy, CoreDNS and kube-router; built
  # once into a cache outside the repository, or taken from
  # KUBEBUILDER_ASSETS), openssl and curl. This check never builds: `make`
  # does that before the tests (scripts/k8s/binaries.sh), and a machine
  # without the cache skips the tier with the reason printed. The answer is
  # kept in :persistent_term.
  #
  # DESIGN.md §9: a tier that cannot run is skipped with a printed reason,
  # and CONDUKT_REQUIRE_ALL_TIERS=1 turns the skip into a failed run.

  @key {__MODULE__, :check}
  alias Condukt.Dev.SystemTools

  @programs ~w(openssl curl timeout setsid kill)

  @doc "`:ok` or `{:skip, reason}`, computed once per VM."
  @spec check() :: :ok | {:skip, String.t()}
  def check, do: SystemTools.once(@key, &compute/0)

  @doc "The skip reason, or nil when the tier can run."
  @spec skip_reason() :: String.t() | nil
  def skip_reason do
    case check() do
      :ok -> nil
      {:skip, reason} -> reason
    end
  end

  @doc "The directory with the tier's binaries (raises when the tier cannot run)."
  @spec bin_dir!() :: Path.t()
  def bin_dir! do
    case :persistent_term.get({__MODULE__, :bin_dir}, nil) do
      nil -> raise "kubernetes tier: #{skip_reason() || "binaries not found"}"
      dir -> dir
    end
  end

  @doc "The absolute path of a system tool; raises when it is missing."
  @spec tool!(String.t()) :: String.t()
  def tool!(name) do
    SystemTools.find(name) || raise("kubernetes tier: `#{name}` not found")
  end

  @doc "scripts/k8s/binaries.sh in this checkout."
  @spec script() :: Path.t()
  def script, do: Path.expand("../../../scripts/k8s/binaries.sh", __DIR__)

  @doc """
  Called from test/test_helper.exs before `ExUnit.start/1`: prints why the
  tier is skipped and excludes `:kubernetes`, or fails the run under
  CONDUKT_REQUIRE_ALL_TIERS=1.
  """
  @spec configure_exunit() :: :ok
  def configure_exunit, do: SystemTools.configure_tier(:kubernetes, check())

  defp compute do
    with :ok <- SystemTools.require(@programs),
         {:ok, dir} <- check_binaries() do
      :persistent_term.put({__MODULE__, :bin_dir}, dir)
      :ok
    end
  end

  defp check_binaries do
    case System.cmd("sh", [script(), "--check"], stderr_to_stdout: true) do
      {out, 0} ->
        {:ok, out |> String.trim() |> String.split("\n") |> List.last()}

      {out, _} ->
        {:skip,
         "the Kubernetes binaries are not built (#{String.trim(out)}); " <>
           "`sh scripts/k8s/setup-go.sh && sh scripts/k8s/binaries.sh` builds them once"}
    end
  end
end
