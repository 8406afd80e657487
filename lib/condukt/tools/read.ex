defmodule Condukt.Tools.Read do
  @moduledoc """
  `Read`: reads a text file through the sandbox.

  Arguments: `path` (relative to the sandbox's directory, or absolute),
  optional `offset` (first line, from 1) and `limit` (number of lines).
  The answer is cut at #{2000} lines or 50 KiB, whichever comes first, and
  says so, so the model can read on with `offset`.

      Condukt.Tools.Read.call(%{"path" => "mix.exs", "limit" => 5}, %{sandbox: sb})
      #=> {:ok, "defmodule MyApp.MixProject do\\n..."}
  """

  use Condukt.Tool

  @max_lines 2000
  @max_bytes 50 * 1024

  @impl true
  def name, do: "Read"

  @impl true
  def description,
    do:
      "Read a text file. Output is cut at #{@max_lines} lines or #{div(@max_bytes, 1024)} KiB; " <>
        "use offset and limit to read a long file in parts."

  @impl true
  def parameters do
    %{
      type: "object",
      properties: %{
        path: %{type: "string", description: "the file, relative to the working directory or absolute"},
        offset: %{type: "integer", minimum: 1, description: "the first line to read, counting from 1"},
        limit: %{type: "integer", minimum: 1, description: "how many lines to read"}
      },
      required: ["path"],
      additionalProperties: false
    }
  end

  @impl true
  def call(%{"path" => path} = args, %{sandbox: sandbox}) do
    with {:ok, content} <- Condukt.Sandbox.read(sandbox, path) do
      lines = String.split(content, "\n")
      offset = args["offset"] || 1
      limit = min(args["limit"] || @max_lines, @max_lines)
      picked = lines |> Enum.drop(offset - 1) |> Enum.take(limit)
      text = Enum.join(picked, "\n")
      {text, cut?} = if byte_size(text) > @max_bytes, do: {binary_part(text, 0, @max_bytes), true}, else: {text, false}
      last = offset - 1 + length(picked)

      cond do
        offset > length(lines) -> {:ok, "(the file has #{length(lines)} lines; offset #{offset} is past its end)"}
        cut? or last < length(lines) -> {:ok, text <> "\n[condukt: shown up to line #{last} of #{length(lines)}]"}
        true -> {:ok, text}
      end
    end
  end
end
