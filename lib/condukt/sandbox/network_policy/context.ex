defmodule Condukt.Sandbox.NetworkPolicy.Context do
  @moduledoc """
  What a decider knows about the session when a `:decide` rule fires.

    * `:session_id` — the gated session's id.
    * `:recent_messages` — the last `:context_messages` entries of the
      session's message history, oldest first.
    * `:request` — the `Condukt.Sandbox.NetworkPolicy.Request` the workspace
      is about to make.
    * `:metadata` — the decide rule's `:context_metadata` (static,
      per-session: user identity, tenant, purpose).
  """

  alias Condukt.Sandbox.NetworkPolicy.Request

  @type t :: %__MODULE__{
          session_id: String.t() | nil,
          recent_messages: [term()],
          request: Request.t() | nil,
          metadata: map()
        }

  defstruct session_id: nil, recent_messages: [], request: nil, metadata: %{}
end
