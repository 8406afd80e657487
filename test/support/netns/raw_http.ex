defmodule Condukt.Test.Netns.RawHttp do
  @moduledoc false
  # What the sidecar's HTTP/1.1 end-to-end tests share: in-pod Python
  # programs that speak raw HTTP (clients/rawhttp.py: connect, Reader,
  # ending, request), and waiting on the proxy's stdout events.

  import ExUnit.Assertions

  alias Condukt.Dev.Netns.{Cmd, Testbed}
  alias Condukt.Test.Netns.Sidecar

  @doc "A query string unique to one test, so events of other tests never match."
  def tag, do: "t=#{System.unique_integer([:positive])}"

  @doc """
  Runs `script` with Python in the pod, after `from rawhttp import *`,
  with argv [CA | args], and returns the JSON it printed last.
  """
  def py(tb, sc, script, args \\ []) do
    argv = ["/usr/bin/python3", "-c", prelude(tb) <> script, sc.ca_cert | args]
    {out, status} = Testbed.exec_in(tb, :pod, argv, timeout: 60_000)
    assert status == 0, "the pod program failed (exit #{status}):\n#{out}\n--- proxy stderr\n#{Sidecar.stderr(sc)}"
    out |> String.split("\n", trim: true) |> List.last() |> Condukt.JSON.decode!()
  end

  @doc "The argv of `py/4`'s program, for tests that run it themselves."
  def argv(tb, sc, script), do: ["/usr/bin/python3", "-c", prelude(tb) <> script, sc.ca_cert]

  defp prelude(tb), do: "import sys\nsys.path.insert(0, #{inspect(tb.bin_dir)})\nfrom rawhttp import *\n"

  @doc """
  The events (from the proxy's stdout, the audit trail) that satisfy `fun`,
  once there are at least `n` of them; flunks after `timeout`.
  """
  def await_events(sc, n, fun, timeout \\ 15_000) do
    case Cmd.poll(fn -> length(Enum.filter(Sidecar.stdout_events(sc), fun)) >= n end, timeout, 50) do
      :ok ->
        Enum.filter(Sidecar.stdout_events(sc), fun)

      {:error, :timeout} ->
        flunk(
          "fewer than #{n} matching events within #{timeout} ms; events so far:\n" <>
            Enum.map_join(Sidecar.stdout_events(sc), "\n", &inspect(Map.take(&1, ~w(event host port query reason)))) <>
            "\n--- proxy stderr\n" <> Sidecar.stderr(sc)
        )
    end
  end

  @doc "The events of the request whose query is `q`, once one of `last` is there."
  def events_for(sc, q, last \\ ~w(request_closed request_failed request_denied)) do
    await_events(sc, 1, &(&1["query"] == q and &1["event"] in last))
    Enum.filter(Sidecar.stdout_events(sc), &(&1["query"] == q))
  end

  @doc "The first value of header `name` (lower case) in `[[name, value]]`."
  def header(headers, name) do
    Enum.find_value(headers, fn [k, v] -> if String.downcase(k) == name, do: v end)
  end
end
