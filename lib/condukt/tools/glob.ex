defmodule Condukt.Tools.Glob do
  @moduledoc """
  `Glob`: lists the files matching a wildcard (`*`, `?`, `**`, `{a,b}`)
  through the sandbox (`Condukt.Sandbox.glob/3`), one per line.

      Condukt.Tools.Glob.call(%{"pattern" => "lib/**/*.ex"}, %{sandbox: sb})
      #=> {:ok, "lib/my_app.ex\\nlib/my_app/repo.ex"}
  """

  use Condukt.Tool

  @impl true
  def name, do: "Glob"

  @impl true
  def description, do: "List the files matching a wildcard pattern such as lib/**/*.ex, one per line."

  @impl true
  def parameters do
    %{
      type: "object",
      properties: %{pattern: %{type: "string", minLength: 1, description: "the wildcard pattern"}},
      required: ["pattern"],
      additionalProperties: false
    }
  end

  @impl true
  def call(%{"pattern" => pattern}, %{sandbox: sandbox}) do
    case Condukt.Sandbox.glob(sandbox, pattern) do
      {:ok, []} -> {:ok, "(no files match #{pattern})"}
      {:ok, paths} -> {:ok, Enum.join(paths, "\n")}
      {:error, :not_supported} -> {:error, "this sandbox cannot glob; use Bash with ls or find"}
      {:error, _} = error -> error
    end
  end
end
