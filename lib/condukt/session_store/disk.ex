defmodule Condukt.SessionStore.Disk do
  @moduledoc """
  A `Condukt.SessionStore` that keeps one JSON file per session id.

  Option `:dir`: the directory of the snapshots. Default:
  `.condukt/sessions` under the BEAM's current directory.

  A snapshot is written to a temporary file in the same directory and
  renamed over the old one, so a crash mid-write leaves the previous
  snapshot whole. The file name is the id when it is a short string of
  letters, digits, `.`, `_` and `-` (and does not start with a dot), and a
  SHA-256 of the id otherwise, so an id can never name a path outside
  `:dir`. Integer ids (a job id) are used as their decimal string.

      {:ok, agent} = MyApp.CodingAgent.start_link(id: 42, session_store: Condukt.SessionStore.Disk)
  """

  @behaviour Condukt.SessionStore

  alias Condukt.Message

  @version 1

  @impl true
  def load(id, opts) do
    case File.read(path(id, opts)) do
      {:ok, json} -> parse(json)
      {:error, :enoent} -> :not_found
      {:error, reason} -> {:error, reason}
    end
  end

  @impl true
  def save(id, messages, opts) do
    path = path(id, opts)

    json =
      Condukt.JSON.encode!(%{
        "version" => @version,
        "id" => key(id),
        "messages" => Enum.map(messages, &Message.to_map/1)
      })

    tmp = path <> ".#{System.unique_integer([:positive])}.tmp"

    with :ok <- File.mkdir_p(Path.dirname(path)),
         :ok <- File.write(tmp, json),
         :ok <- File.rename(tmp, path) do
      :ok
    else
      error ->
        File.rm(tmp)
        error
    end
  end

  @impl true
  def clear(id, opts) do
    case File.rm(path(id, opts)) do
      :ok -> :ok
      {:error, :enoent} -> :ok
      error -> error
    end
  end

  @doc "The snapshot file of `id`."
  @spec path(term(), keyword()) :: Path.t()
  def path(id, opts) do
    dir = Keyword.get(opts, :dir, Path.join(File.cwd!(), ".condukt/sessions"))
    key = key(id)

    name =
      if String.match?(key, ~r/\A[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}\z/),
        do: key,
        else: :crypto.hash(:sha256, key) |> Base.encode16(case: :lower)

    Path.join(dir, name <> ".json")
  end

  defp key(id) when is_binary(id), do: id
  defp key(id) when is_integer(id), do: Integer.to_string(id)
  defp key(id), do: inspect(id)

  defp parse(json) do
    case Condukt.JSON.decode!(json) do
      %{"version" => @version, "messages" => list} when is_list(list) ->
        Condukt.Options.map_ok(list, &Message.from_map/1)

      other ->
        {:error, "not a version #{@version} session snapshot: #{inspect(other, limit: 5)}"}
    end
  rescue
    _ -> {:error, "the snapshot is not JSON"}
  end
end
