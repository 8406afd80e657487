defmodule Condukt.Tools.Write do
  @moduledoc """
  `Write`: writes a whole file through the sandbox, creating parent
  directories (`Condukt.Sandbox.write/3`).

      Condukt.Tools.Write.call(%{"path" => "notes.md", "content" => "- ship it\\n"}, %{sandbox: sb})
      #=> {:ok, "wrote 10 bytes to notes.md"}
  """

  use Condukt.Tool

  @impl true
  def name, do: "Write"

  @impl true
  def description, do: "Write a file, replacing all of its content. Creates missing directories."

  @impl true
  def parameters do
    %{
      type: "object",
      properties: %{
        path: %{type: "string", description: "the file, relative to the working directory or absolute"},
        content: %{type: "string", description: "the whole new content"}
      },
      required: ["path", "content"],
      additionalProperties: false
    }
  end

  @impl true
  def call(%{"path" => path, "content" => content}, %{sandbox: sandbox}) do
    with :ok <- Condukt.Sandbox.write(sandbox, path, content),
         do: {:ok, "wrote #{byte_size(content)} bytes to #{path}"}
  end
end
