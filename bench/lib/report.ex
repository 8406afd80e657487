defmodule Bench.Report do
  @moduledoc false
  def write(result, cfg, elapsed) do
    File.mkdir_p!(cfg.out)
    IO.inspect(result, limit: :infinity)
    IO.inspect(elapsed)
  end

  def profile(_tb, _url, _cfg), do: nil
end
