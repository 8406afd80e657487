defmodule Condukt.Tools.Edit do
  @moduledoc """
  `Edit`: replaces the one occurrence of `old_text` in a file with
  `new_text` (`Condukt.Sandbox.edit/4`). When `old_text` occurs zero or
  several times nothing changes and the model is told how to fix the call.

      Condukt.Tools.Edit.call(%{"path" => "notes.md", "old_text" => "ship it", "new_text" => "ship it today"}, %{sandbox: sb})
      #=> {:ok, "edited notes.md"}
  """

  use Condukt.Tool

  @impl true
  def name, do: "Edit"

  @impl true
  def description,
    do:
      "Replace one exact occurrence of old_text in a file with new_text. old_text must match exactly once, " <>
        "whitespace included; read the file first."

  @impl true
  def parameters do
    %{
      type: "object",
      properties: %{
        path: %{type: "string", description: "the file to edit"},
        old_text: %{type: "string", minLength: 1, description: "the exact text to replace"},
        new_text: %{type: "string", description: "the replacement"}
      },
      required: ["path", "old_text", "new_text"],
      additionalProperties: false
    }
  end

  @impl true
  def call(%{"path" => path, "old_text" => old, "new_text" => new}, %{sandbox: sandbox}) do
    with :ok <- Condukt.Sandbox.edit(sandbox, path, old, new), do: {:ok, "edited #{path}"}
  end
end
