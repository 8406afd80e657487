defmodule Condukt.Test.ModuleDecider do
  @moduledoc false
  @behaviour Condukt.Sandbox.NetworkPolicy.Decider

  @impl true
  def decide(_ctx, _req, _opts), do: :allow

  @doc false
  def two(_ctx, _req), do: :allow
end

defmodule Condukt.Test.NotADecider do
  @moduledoc false
  def other, do: :ok
end
