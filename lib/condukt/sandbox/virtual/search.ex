defmodule Condukt.Sandbox.Virtual.Search do
  @moduledoc false
  # glob and grep for Condukt.Sandbox.Virtual over the virtual file system,
  # with the semantics of Condukt.Sandbox.Local.Search: glob is
  # :filelib.wildcard/3 itself, given a file module that lists the virtual
  # tree; grep walks it the same way and shares Local's line matching.

  alias Condukt.Sandbox.Local.Search, as: LocalSearch
  alias Condukt.Sandbox.Virtual.Native

  # grep skips files larger than this, as Local does.
  @max_file_bytes 16 * 1024 * 1024

  defmodule Files do
    @moduledoc false
    # The file module :filelib.wildcard/3 lists directories through. The
    # sandbox it reads is in the calling process's dictionary for the length
    # of one wildcard call (filelib takes a module, not a closure).

    require Record
    Record.defrecordp(:file_info, Record.extract(:file_info, from_lib: "kernel/include/file.hrl"))

    @doc false
    def list_dir(dir) do
      {fs, dots?} = Process.get(Files)

      case Native.list_dir(fs, IO.chardata_to_string(dir)) do
        {:ok, entries} ->
          names =
            for {name, _kind} <- entries, dots? or not String.starts_with?(name, "."), do: String.to_charlist(name)

          {:ok, names}

        {:error, {reason, _}} ->
          {:error, reason}
      end
    end

    @doc false
    def read_link_info(file), do: read_file_info(file)

    @doc false
    def read_file_info(file) do
      {fs, _} = Process.get(Files)

      case Native.stat(fs, IO.chardata_to_string(file)) do
        {:ok, {kind, size}} -> {:ok, file_info(type: type(kind), size: size)}
        {:error, {reason, _}} -> {:error, reason}
      end
    end

    defp type(:file), do: :regular
    defp type(:directory), do: :directory
    defp type(:symlink), do: :symlink
    defp type(_), do: :other
  end

  @spec glob(reference(), String.t(), String.t(), boolean()) :: {:ok, [String.t()]} | {:error, term()}
  def glob(fs, cwd, pattern, match_dot?) do
    if String.contains?(pattern, <<0>>) do
      {:error, "a pattern cannot contain a NUL byte"}
    else
      previous = Process.put(Files, {fs, match_dot?})

      try do
        paths = :filelib.wildcard(String.to_charlist(pattern), String.to_charlist(cwd), Files)
        {:ok, paths |> Enum.map(&IO.chardata_to_string/1) |> Enum.sort()}
      catch
        :error, {:badpattern, why} -> {:error, why}
      after
        if previous, do: Process.put(Files, previous), else: Process.delete(Files)
      end
    end
  end

  @spec grep(reference(), String.t(), String.t(), String.t(), map()) ::
          {:ok, [Condukt.Sandbox.grep_match()]} | {:error, term()}
  def grep(fs, root, abs_root, pattern, opts) do
    with {:ok, matcher} <- LocalSearch.matcher(pattern, opts),
         {:ok, files} <- files(fs, root, abs_root, opts) do
      matches =
        files
        |> Stream.flat_map(fn {shown, abs} -> search_file(fs, shown, abs, matcher) end)
        |> Enum.take(opts.max_matches)

      {:ok, matches}
    end
  end

  defp files(fs, root, abs_root, opts) do
    case Native.stat(fs, abs_root) do
      {:ok, {:directory, _}} when is_map_key(opts, :glob) ->
        case glob(fs, abs_root, opts.glob, opts.hidden) do
          {:ok, rels} -> {:ok, Stream.map(rels, &{shown(root, &1), abs_root <> "/" <> &1})}
          {:error, why} -> {:error, {:invalid_pattern, why}}
        end

      {:ok, {:directory, _}} ->
        {:ok, walk(fs, root, abs_root, opts.hidden)}

      {:ok, _file} ->
        {:ok, [{root, abs_root}]}

      {:error, {reason, _}} ->
        {:error, reason}
    end
  end

  defp walk(fs, shown_dir, abs_dir, hidden?) do
    case Native.list_dir(fs, abs_dir) do
      {:ok, entries} ->
        entries
        |> Enum.sort()
        |> Enum.reject(fn {name, _} -> not hidden? and String.starts_with?(name, ".") end)
        |> Stream.flat_map(fn
          {name, :directory} -> walk(fs, shown(shown_dir, name), join(abs_dir, name), hidden?)
          {name, :file} -> [{shown(shown_dir, name), join(abs_dir, name)}]
          _other -> []
        end)

      {:error, _} ->
        []
    end
  end

  defp join("/", name), do: "/" <> name
  defp join(dir, name), do: dir <> "/" <> name

  defp shown(".", name), do: name
  defp shown(dir, name), do: Path.join(dir, name)

  defp search_file(fs, shown, abs, matcher) do
    with {:ok, {:file, size}} when size <= @max_file_bytes <- Native.stat(fs, abs),
         {:ok, content} <- Native.read_file(fs, abs) do
      LocalSearch.match_lines(shown, content, matcher)
    else
      _ -> []
    end
  end
end
