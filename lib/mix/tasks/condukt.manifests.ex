defmodule Mix.Tasks.Condukt.Manifests do
  @shortdoc "Prints the Kubernetes objects a Kubernetes sandbox session would create, as YAML"

  @moduledoc """
  Prints, as YAML documents, the objects `Condukt.Sandbox.Kubernetes.init/1`
  would create for the given options (`Condukt.Sandbox.Kubernetes.manifests/1`),
  without creating anything.

      mix condukt.manifests --namespace agents --id job-42
      mix condukt.manifests --namespace agents --allow api.github.com --allow "*.npmjs.org"
      mix condukt.manifests --options sandbox.exs | kubectl apply --dry-run=server -f -

  Options:

    * `--options FILE` - an Elixir file whose last expression is a keyword
      list of `init/1` options (a policy with decide rules, resources,
      tolerations, ...); the flags below are merged over it.
    * `--id ID`, `--namespace NS`, `--image IMAGE`,
      `--network-policy-image IMAGE`, `--runtime-class-name NAME`,
      `--priority-class-name NAME`, `--image-pull-secret NAME` (repeatable).
    * `--allow HOST`, `--deny HOST` (repeatable) and `--default allow|deny`:
      a network policy of allow and deny rules, in the order given (all
      allow rules first, then deny rules).

  The Secrets' per-session values (CA certificate and key, control token)
  are placeholders; see `Condukt.Sandbox.Kubernetes.manifests/1`.
  """
  use Mix.Task

  alias Condukt.Sandbox.Kubernetes
  alias Condukt.Sandbox.Kubernetes.YAML

  @switches [
    options: :string,
    id: :string,
    namespace: :string,
    image: :string,
    network_policy_image: :string,
    runtime_class_name: :string,
    priority_class_name: :string,
    image_pull_secret: :keep,
    allow: :keep,
    deny: :keep,
    default: :string
  ]

  @impl true
  @spec run([String.t()]) :: :ok
  def run(argv) do
    {parsed, rest, invalid} = OptionParser.parse(argv, strict: @switches)

    cond do
      invalid != [] -> Mix.raise("unknown or invalid option: #{inspect(invalid)}")
      rest != [] -> Mix.raise("unexpected arguments: #{Enum.join(rest, " ")}")
      true -> :ok
    end

    Mix.Task.run("app.config")
    {:ok, _} = Application.ensure_all_started(:condukt)

    case Kubernetes.manifests(options(parsed)) do
      {:ok, objects} -> Mix.shell().info(String.trim_trailing(YAML.encode_documents(objects)))
      {:error, e} -> Mix.raise(Exception.message(e))
    end
  end

  @doc false
  @spec options(keyword()) :: keyword()
  def options(parsed) do
    base =
      case parsed[:options] do
        nil -> []
        file -> from_file(file)
      end

    flags =
      for key <- [:id, :namespace, :image, :network_policy_image, :runtime_class_name, :priority_class_name],
          value = parsed[key],
          do: {key, value}

    secrets = Keyword.get_values(parsed, :image_pull_secret)
    flags = if secrets == [], do: flags, else: flags ++ [image_pull_secrets: secrets]
    allow = Keyword.get_values(parsed, :allow)
    deny = Keyword.get_values(parsed, :deny)

    policy =
      if allow == [] and deny == [] and parsed[:default] == nil,
        do: [],
        else: [
          network_policy: [
            rules: [allow: allow, deny: deny] |> Enum.reject(&(elem(&1, 1) == [])),
            default: default(parsed[:default])
          ]
        ]

    Keyword.merge(base, flags ++ policy)
  end

  defp default(nil), do: :deny
  defp default("deny"), do: :deny
  defp default("allow"), do: :allow
  defp default(other), do: Mix.raise("--default must be allow or deny, got: #{other}")

  defp from_file(file) do
    case Code.eval_file(file) do
      {opts, _} when is_list(opts) ->
        if Keyword.keyword?(opts), do: opts, else: Mix.raise("#{file} must evaluate to a keyword list")

      {other, _} ->
        Mix.raise("#{file} must evaluate to a keyword list, got: #{inspect(other)}")
    end
  end
end
