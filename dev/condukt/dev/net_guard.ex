defmodule Condukt.Dev.NetGuard do
  @moduledoc false
  # The network gatekeeper agent of the demo and the tests: the seeds'
  # MyApp.NetGuard, run on the local model (Condukt.Dev.LLM).
  use Condukt

  @impl true
  def system_prompt do
    """
    You are the network gatekeeper of an AI coding session. For each outbound request,
    allow it when the host is a well-known, reputable API or package registry that the
    session's task plausibly needs, and deny it otherwise. Keep the reason short.
    """
  end
end
