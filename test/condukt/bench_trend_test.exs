Code.require_file(Path.expand("../../bench/lib/trend.ex", __DIR__))

defmodule Condukt.BenchTrendTest do
  # The soak's verdict (bench/lib/trend.ex, bench/README.md "Soak"): a
  # series fails only when it rises both significantly (Mann-Kendall) and
  # by more than its tolerance over the span (Theil-Sen).
  use ExUnit.Case, async: true

  alias Bench.Trend

  # 45 samples 20 s apart, as a 15-minute soak takes them.
  defp series(f), do: for(i <- 0..44, do: {i * 20, f.(i)})

  # Deterministic noise in [-1, 1].
  defp noise(i) do
    x = :math.sin(i * 12.9898) * 43_758.5453
    2 * (x - Float.floor(x)) - 1
  end

  test "a flat, noisy series does not trend up" do
    v = Trend.verdict(series(fn i -> 12_000 + 300 * noise(i) end), 2048)
    refute v.up, inspect(v)
    assert abs(v.z) < Trend.z_crit()
  end

  test "a steady rise beyond the tolerance trends up" do
    # 10 per sample: 440 over the span, noise of ±3.
    v = Trend.verdict(series(fn i -> 12_000 + 10 * i + 3 * noise(i) end), 100)
    assert v.up, inspect(v)
    assert v.z > Trend.z_crit()
    assert_in_delta v.slope_per_h, 10 * 3600 / 20, 5
  end

  test "a significant rise smaller than the tolerance passes" do
    v = Trend.verdict(series(fn i -> 12_000 + i end), 2048)
    assert v.z > Trend.z_crit()
    refute v.up, inspect(v)
  end

  test "spikes do not make a trend" do
    v = Trend.verdict(series(fn i -> if rem(i, 7) == 6, do: 90_000, else: 12_000 + 100 * noise(i) end), 2048)
    refute v.up, inspect(v)
  end

  test "a leak of one descriptor every few samples trends up" do
    v = Trend.verdict(series(fn i -> 30 + div(i, 5) end), 4)
    assert v.up, inspect(v)
  end

  test "ties and short series" do
    refute Trend.verdict(series(fn _ -> 30 end), 4).up
    assert Trend.mann_kendall_z([1, 1, 1]) == 0.0
    refute Trend.verdict([{0, 1}, {1, 100}], 0).up
    assert Trend.median([3, 1, 2]) == 2
    assert Trend.median([4, 1, 2, 3]) == 2.5
    assert Trend.sen_slope([{0, 0}, {10, 5}, {20, 10}]) == 0.5
  end
end
