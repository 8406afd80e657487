defmodule Bench.Trend do
  @moduledoc false
  # Does a series trend up? The soak's verdict on RSS, file descriptors and
  # latency (bench/README.md, "Soak").
  #
  # Two robust, distribution-free tools, both insensitive to a few outliers
  # (a latency spike when another job hits the machine):
  #
  # * the Mann-Kendall test: S = sum over every pair i < j of
  #   sign(x_j - x_i); under "no trend" S is about normal with mean 0 and
  #   variance n(n-1)(2n+5)/18 (less a correction for ties). A one-sided
  #   z = (S - 1) / sqrt(var) above 2.326 (p < 0.01) says the series rises
  #   more often than chance allows.
  # * the Theil-Sen slope: the median of the pairwise slopes
  #   (x_j - x_i) / (t_j - t_i); times the span of the series it is how
  #   much the series grew, robustly.
  #
  # A series "trends up" only when both hold: the rise is significant AND
  # its size over the span exceeds the metric's tolerance. Significance
  # alone would fail a run on a rise of a few KiB that is real but
  # harmless (a cache reaching its bound), size alone on noise.

  @z_crit 2.326

  @doc "The median of a non-empty list of numbers."
  def median(xs) do
    s = Enum.sort(xs)
    n = length(s)
    if rem(n, 2) == 1, do: Enum.at(s, div(n, 2)), else: (Enum.at(s, div(n, 2) - 1) + Enum.at(s, div(n, 2))) / 2
  end

  @doc "The Theil-Sen slope of points [{t, x}] (x per unit of t); nil for fewer than 2 distinct t."
  def sen_slope(points) do
    slopes =
      for {{t1, x1}, i} <- Enum.with_index(points), {{t2, x2}, j} <- Enum.with_index(points), i < j, t2 != t1 do
        (x2 - x1) / (t2 - t1)
      end

    if slopes == [], do: nil, else: median(slopes)
  end

  @doc "The Mann-Kendall z of the values in time order (0.0 when fewer than 3)."
  def mann_kendall_z(xs) do
    n = length(xs)

    if n < 3 do
      0.0
    else
      indexed = Enum.with_index(xs)

      s =
        for {a, i} <- indexed, {b, j} <- indexed, i < j, reduce: 0 do
          acc -> acc + sign(b - a)
        end

      ties =
        xs
        |> Enum.frequencies()
        |> Map.values()
        |> Enum.filter(&(&1 > 1))
        |> Enum.map(fn t -> t * (t - 1) * (2 * t + 5) end)
        |> Enum.sum()

      var = (n * (n - 1) * (2 * n + 5) - ties) / 18

      cond do
        var <= 0 -> 0.0
        s > 0 -> (s - 1) / :math.sqrt(var)
        s < 0 -> (s + 1) / :math.sqrt(var)
        true -> 0.0
      end
    end
  end

  defp sign(d) when d > 0, do: 1
  defp sign(d) when d < 0, do: -1
  defp sign(_), do: 0

  @doc """
  The verdict on points [{t_seconds, x}] with `tolerance` the largest
  growth over the series' span that is accepted: a number, or a function
  of the series' median. Returns a map: :up (true = fails), :z, :slope_per_h,
  :growth (slope times span), :tolerance, :median, :n.
  """
  def verdict(points, tolerance) do
    xs = Enum.map(points, &elem(&1, 1))
    ts = Enum.map(points, &elem(&1, 0))
    n = length(points)

    if n < 3 do
      %{up: false, n: n, z: 0.0, slope_per_h: nil, growth: nil, tolerance: nil, median: nil, note: "too few samples"}
    else
      med = median(xs)
      tol = if is_function(tolerance), do: tolerance.(med), else: tolerance
      slope = sen_slope(points) || 0.0
      span = Enum.max(ts) - Enum.min(ts)
      growth = slope * span
      z = mann_kendall_z(xs)

      %{
        up: z > @z_crit and growth > tol,
        n: n,
        z: z,
        slope_per_h: slope * 3600,
        growth: growth,
        tolerance: tol,
        median: med
      }
    end
  end

  @doc "The one-sided z a verdict needs to call a rise significant."
  def z_crit, do: @z_crit
end
