defmodule Condukt.SessionStore do
  @moduledoc """
  Where a session's messages survive the session process: a snapshot per
  session id, restored when a session with the same id starts.

      MyApp.CodingAgent.start_link(id: job_id, session_store: Condukt.SessionStore.Disk)
      MyApp.CodingAgent.start_link(id: job_id, session_store: {Condukt.SessionStore.Disk, dir: "/var/lib/agents"})

  The session saves after every message it adds (a prompt, an answer, a
  tool result), so a job that crashes mid-run restarts from where it was.
  `Condukt.SessionStore.Disk` ships; a store of your own implements the
  three callbacks below. A snapshot is plain data (`Condukt.Message`
  structs); what a store does with it is its own business.
  """

  alias Condukt.Message

  @typedoc "A store module, or a module with its options."
  @type store :: module() | {module(), keyword()}

  @doc "The messages saved for `id`, or `:not_found`."
  @callback load(id :: term(), opts :: keyword()) :: {:ok, [Message.t()]} | :not_found | {:error, term()}

  @doc "Replaces the snapshot of `id` with `messages`."
  @callback save(id :: term(), messages :: [Message.t()], opts :: keyword()) :: :ok | {:error, term()}

  @doc "Deletes the snapshot of `id` (no error when there is none)."
  @callback clear(id :: term(), opts :: keyword()) :: :ok | {:error, term()}

  @doc "Loads through `store`."
  @spec load(store(), term()) :: {:ok, [Message.t()]} | :not_found | {:error, term()}
  def load(store, id), do: call(store, :load, [id])

  @doc "Saves through `store`."
  @spec save(store(), term(), [Message.t()]) :: :ok | {:error, term()}
  def save(store, id, messages), do: call(store, :save, [id, messages])

  @doc "Clears through `store`."
  @spec clear(store(), term()) :: :ok | {:error, term()}
  def clear(store, id), do: call(store, :clear, [id])

  defp call({module, opts}, fun, args) when is_atom(module) and is_list(opts), do: apply(module, fun, args ++ [opts])
  defp call(module, fun, args) when is_atom(module), do: apply(module, fun, args ++ [[]])
end
