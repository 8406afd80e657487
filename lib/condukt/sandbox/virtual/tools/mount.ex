defmodule Condukt.Sandbox.Virtual.Tools.Mount do
  @moduledoc """
  `Mount`: lets the agent mount a host directory into its
  `Condukt.Sandbox.Virtual` file system, within the directories the
  sandbox's `:agent_mounts` option allows (read-only unless the agent asks
  for read-write and an allowed `:readwrite` directory holds it).

      {:ok, sb} =
        Condukt.Sandbox.new(
          {Condukt.Sandbox.Virtual, agent_mounts: [{"/srv/datasets", :readonly}]}
        )

      Condukt.Sandbox.Virtual.Tools.Mount.call(
        %{"host_path" => "/srv/datasets/2026", "sandbox_path" => "/data"},
        %{sandbox: sb}
      )
      #=> {:ok, "mounted /srv/datasets/2026 at /data (read-only)"}

  Only the Virtual sandbox mounts: against any other sandbox the tool
  answers with an error that says so.

      def tools, do: Condukt.Tools.coding_tools() ++ [Condukt.Sandbox.Virtual.Tools.Mount]
  """

  use Condukt.Tool

  alias Condukt.Sandbox.Virtual

  @impl true
  def name, do: "Mount"

  @impl true
  def description,
    do:
      "Mount a directory of the host into the sandbox's file system, read-only by default. " <>
        "Only directories the sandbox allows can be mounted."

  @impl true
  def parameters do
    %{
      type: "object",
      properties: %{
        host_path: %{type: "string", minLength: 1, description: "the host directory, absolute"},
        sandbox_path: %{type: "string", minLength: 1, description: "where it appears in the sandbox"},
        mode: %{type: "string", enum: ["readonly", "readwrite"], description: "default readonly"}
      },
      required: ["host_path", "sandbox_path"],
      additionalProperties: false
    }
  end

  @impl true
  def call(%{"host_path" => host, "sandbox_path" => at} = args, %{sandbox: %Condukt.Sandbox{module: Virtual} = sb}) do
    mode = if args["mode"] == "readwrite", do: :readwrite, else: :readonly

    with :ok <- Virtual.agent_mount(sb, host, at, mode) do
      {:ok, "mounted #{host} at #{at} (#{if mode == :readonly, do: "read-only", else: "read-write"})"}
    end
  end

  def call(_args, %{sandbox: %Condukt.Sandbox{module: module}}),
    do:
      {:error,
       "Mount is not supported: this session's sandbox is #{inspect(module)}, which does not mount host " <>
         "directories (only Condukt.Sandbox.Virtual does)"}
end
