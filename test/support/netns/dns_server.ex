defmodule Condukt.Test.Netns.DnsServer do
  @moduledoc false
  # servers/dns_server.py in a testbed's inet namespace, on UDP and TCP
  # port 53 of the inet addresses: the resolvers the sidecar's own stub
  # asks (`proxy --dns-upstream`, Sidecar's default). A test sets the
  # answers (a zone: %{"name" => ["address", ...]}, read again for every
  # query) and reads back every query that reached it: what a tunnel
  # through DNS would have carried out of the pod.

  alias Condukt.Dev.Netns.{Cmd, Testbed, Tier}

  defstruct [:tb, :zone_path, :log, :pid]

  @type t :: %__MODULE__{}

  @doc "Starts the server with `zone`; it is stopped when the test (or setup_all) ends."
  @spec start(Testbed.t(), map()) :: t()
  def start(tb, zone) do
    dir = Path.join(tb.dir, "dns-#{System.unique_integer([:positive])}")
    File.mkdir_p!(dir)
    d = %__MODULE__{tb: tb, zone_path: Path.join(dir, "zone.json"), log: Path.join(dir, "queries.ndjson")}
    set_zone(d, zone)
    File.write!(d.log, "")

    argv = [Tier.tool!("python3"), Path.join(tb.bin_dir, "dns_server.py"), d.zone_path, d.log, tb.inet.v4, tb.inet.v6]

    pid = Testbed.spawn_in(tb, :inet, argv, log: Path.join(dir, "dns_server.log"))
    ExUnit.Callbacks.on_exit({__MODULE__, dir}, fn -> Cmd.kill([pid]) end)
    v4 = "#{tb.inet.v4}:53"
    v6 = "[#{tb.inet.v6}]:53"
    :ok = Testbed.wait_listening(tb, :inet, udp: [v4, v6], tcp: [v4, v6], pids: [pid])
    %{d | pid: pid}
  end

  @doc "Replaces the answers (atomically: a query sees the old zone or the new)."
  @spec set_zone(t(), map()) :: :ok
  def set_zone(d, zone) do
    tmp = d.zone_path <> ".tmp"
    File.write!(tmp, Condukt.JSON.encode!(zone))
    File.rename!(tmp, d.zone_path)
  end

  @doc "Every query that reached the server so far: %{\"name\", \"type\", \"transport\"}."
  @spec queries(t()) :: [map()]
  def queries(d) do
    d.log |> File.read!() |> String.split("\n", trim: true) |> Enum.map(&Condukt.JSON.decode!/1)
  end
end
