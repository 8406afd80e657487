defmodule Condukt.Session.Instructions do
  @moduledoc false
  # Project instructions, read through the session's sandbox at start:
  # AGENTS.md, CLAUDE.md and .agents/skills/*/SKILL.md. Through the
  # sandbox, not the host filesystem, so that a session in a pod reads the
  # pod's workspace. Missing files are fine; each file is cut at 64 KiB so
  # that one huge file cannot fill the context.

  alias Condukt.Sandbox

  @max_bytes 64 * 1024

  @spec load(Sandbox.t()) :: String.t() | nil
  def load(sandbox) do
    files = read_all(sandbox, ["AGENTS.md", "CLAUDE.md"] ++ skills(sandbox))

    case files do
      [] -> nil
      files -> Enum.map_join(files, "\n\n", fn {path, text} -> "# Project instructions: #{path}\n\n#{text}" end)
    end
  end

  defp skills(sandbox) do
    case Sandbox.glob(sandbox, ".agents/skills/*/SKILL.md") do
      {:ok, paths} -> Enum.sort(paths)
      {:error, _} -> []
    end
  end

  defp read_all(sandbox, paths) do
    for path <- paths, {:ok, text} <- [Sandbox.read(sandbox, path)], String.trim(text) != "" do
      {path, if(byte_size(text) > @max_bytes, do: binary_part(text, 0, @max_bytes) <> "\n[cut]", else: text)}
    end
  end
end
