defmodule Condukt.Tools.Bash do
  @moduledoc """
  `Bash`: runs a shell command in the sandbox (`Condukt.Sandbox.exec/3`)
  and answers with its output and exit code. Each call is a fresh shell:
  `cd` and `export` do not carry over. Network access goes through the
  sandbox's network policy when it has one.

      Condukt.Tools.Bash.call(%{"command" => "echo hi"}, %{sandbox: sb})
      #=> {:ok, "hi\\n[exit code: 0]"}
      Condukt.Tools.Bash.call(%{"command" => "printf hi"}, %{sandbox: sb})
      #=> {:ok, "hi\\n[exit code: 0]"}

  A non-zero exit code is still a successful tool call (the model reads
  the output); a command that times out or cannot start is an error result.
  """

  use Condukt.Tool

  @impl true
  def name, do: "Bash"

  @impl true
  def description,
    do:
      "Run a bash command and get its combined stdout and stderr and its exit code. Each call is a new shell; " <>
        "cd and export do not persist."

  @impl true
  def parameters do
    %{
      type: "object",
      properties: %{
        command: %{type: "string", description: "the command line"},
        timeout: %{type: "integer", minimum: 1, description: "milliseconds before the command is killed"}
      },
      required: ["command"],
      additionalProperties: false
    }
  end

  @impl true
  def call(%{"command" => command} = args, %{sandbox: sandbox}) do
    opts = if args["timeout"], do: [timeout: args["timeout"]], else: []

    with {:ok, %{output: output, exit_code: code}} <- Condukt.Sandbox.exec(sandbox, command, opts),
         do: {:ok, output <> separator(output) <> "[exit code: #{code}]"}
  end

  defp separator(""), do: ""
  defp separator(output), do: if(String.ends_with?(output, "\n"), do: "", else: "\n")
end
