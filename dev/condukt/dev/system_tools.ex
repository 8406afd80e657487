defmodule Condukt.Dev.SystemTools do
  @moduledoc false
  # What the test tiers share about the machine: programs are looked up in
  # the system directories only, never on the caller's PATH (a user's pyenv
  # or nvm shims must not stand in for Debian's tools), and a tier's
  # "can it run here?" answer is computed once per VM.

  @dirs ~w(/usr/sbin /usr/bin /sbin /bin)

  @doc "The absolute path of an executable program in the system directories, or nil."
  @spec find(String.t()) :: String.t() | nil
  def find(name), do: Enum.find_value(@dirs, &executable(Path.join(&1, name)))

  @doc "Which of `names` are missing, as a `{:skip, reason}`, or `:ok`."
  @spec require([String.t()]) :: :ok | {:skip, String.t()}
  def require(names) do
    case Enum.reject(names, &find/1) do
      [] -> :ok
      missing -> {:skip, "missing programs: #{Enum.join(Enum.sort(missing), ", ")}"}
    end
  end

  @doc "`compute.()` once per VM, kept in :persistent_term under `key`."
  @spec once(term(), (() -> result)) :: result when result: term()
  def once(key, compute) do
    case :persistent_term.get(key, nil) do
      nil ->
        result = compute.()
        :persistent_term.put(key, result)
        result

      result ->
        result
    end
  end

  @doc """
  Applies a tier's `check` result to ExUnit before `ExUnit.start/1`: when
  it is `{:skip, reason}`, prints why and excludes `tag`, or fails the run
  under CONDUKT_REQUIRE_ALL_TIERS=1, unless the command line already
  excludes `tag` (`mix test --exclude kubernetes`).
  """
  @spec configure_tier(atom(), :ok | {:skip, String.t()}) :: :ok
  def configure_tier(_tag, :ok), do: :ok

  def configure_tier(tag, {:skip, reason}) do
    config = ExUnit.configuration()
    excluded = Keyword.get(config, :exclude, [])

    cond do
      # `mix test --exclude TAG` (make test runs the Kubernetes tier in a
      # second run of its own): this run would not run the tier anyway.
      tag in excluded and tag not in Keyword.get(config, :include, []) ->
        IO.puts(:stderr, "#{tag} tier not in this run (--exclude #{tag})")

      System.get_env("CONDUKT_REQUIRE_ALL_TIERS") == "1" ->
        Mix.raise("the #{inspect(tag)} tier is required (CONDUKT_REQUIRE_ALL_TIERS=1) but cannot run: #{reason}")

      true ->
        IO.puts(:stderr, "#{tag} tier skipped: #{reason}")
        ExUnit.configure(exclude: Enum.uniq([tag | excluded]))
    end

    :ok
  end

  defp executable(path) do
    case File.stat(path) do
      {:ok, %{type: :regular, mode: mode}} when Bitwise.band(mode, 0o111) != 0 -> path
      _ -> nil
    end
  end
end
