defmodule Condukt.Provider.SSETest do
  use ExUnit.Case, async: true

  alias Condukt.Provider.HTTP

  test "server-sent events split across chunks" do
    assert {[], "data: {\"a\""} = HTTP.sse_events("data: {\"a\"")
    assert {[{nil, "{\"a\":1}"}], ""} = HTTP.sse_events("data: {\"a\":1}\n\n")

    assert {[{"content_block_delta", "x"}, {nil, "[DONE]"}], "event: pi"} =
             HTTP.sse_events("event: content_block_delta\r\ndata: x\r\n\r\n: comment\n\ndata: [DONE]\n\nevent: pi")

    # Multi-line data joins with newlines; events without data are dropped.
    assert {[{nil, "a\nb"}], ""} = HTTP.sse_events("data: a\ndata: b\n\nevent: ping\n\n")
  end
end
