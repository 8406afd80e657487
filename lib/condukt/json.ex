defmodule Condukt.JSON do
  @moduledoc false
  # JSON through :jiffy (Debian's erlang-jiffy offline, the Hex package
  # otherwise). `nil` is JSON null both ways; objects decode to maps with
  # binary keys. Encode `{[{key, value}]}` for a fixed member order.

  @spec encode!(term()) :: binary()
  def encode!(term), do: term |> :jiffy.encode([:use_nil]) |> IO.iodata_to_binary()

  @spec decode!(iodata()) :: term()
  def decode!(json), do: :jiffy.decode(json, [:return_maps, {:null_term, nil}])
end
