defmodule Condukt.Tools.Grep do
  @moduledoc """
  `Grep`: searches file contents through the sandbox
  (`Condukt.Sandbox.grep/3`) and answers `path:line: text`, one match per
  line.

      Condukt.Tools.Grep.call(%{"pattern" => "defmodule", "glob" => "**/*.ex"}, %{sandbox: sb})
      #=> {:ok, "lib/my_app.ex:1: defmodule MyApp do"}
  """

  use Condukt.Tool

  @impl true
  def name, do: "Grep"

  @impl true
  def description,
    do: "Search file contents with a regular expression (or plain text with literal: true); answers path:line: text."

  @impl true
  def parameters do
    %{
      type: "object",
      properties: %{
        pattern: %{type: "string", minLength: 1, description: "the regular expression"},
        path: %{type: "string", description: "the file or directory to search (default: the working directory)"},
        glob: %{type: "string", description: "only files matching this wildcard, such as **/*.ex"},
        literal: %{type: "boolean", description: "treat the pattern as plain text"},
        ignore_case: %{type: "boolean", description: "match case-insensitively"}
      },
      required: ["pattern"],
      additionalProperties: false
    }
  end

  @impl true
  def call(%{"pattern" => pattern} = args, %{sandbox: sandbox}) do
    opts =
      for key <- [:path, :glob, :literal, :ignore_case],
          Map.has_key?(args, Atom.to_string(key)),
          do: {key, args[Atom.to_string(key)]}

    case Condukt.Sandbox.grep(sandbox, pattern, opts) do
      {:ok, []} -> {:ok, "(no matches)"}
      {:ok, matches} -> {:ok, Enum.map_join(matches, "\n", &"#{&1.path}:#{&1.line_number}: #{&1.line}")}
      {:error, :not_supported} -> {:error, "this sandbox cannot grep; use Bash with grep"}
      {:error, _} = error -> error
    end
  end
end
