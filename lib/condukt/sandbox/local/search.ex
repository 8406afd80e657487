defmodule Condukt.Sandbox.Local.Search do
  @moduledoc false
  # glob and grep for Condukt.Sandbox.Local, in Elixir: no pattern or path
  # is ever handed to a shell or to an external grep.

  # grep skips files larger than this rather than reading them whole.
  @max_file_bytes 16 * 1024 * 1024
  # A NUL byte in this many leading bytes marks a file as binary (git and
  # ripgrep use the same heuristic).
  @binary_sniff_bytes 8 * 1024
  # Matching lines are cut to this many bytes so that one minified file
  # cannot flood an agent's context.
  @max_line_bytes 1_000

  defmodule NoDot do
    @moduledoc false
    # The file module :filelib.wildcard/3 lists directories through. Hiding
    # dot entries from listings gives Path.wildcard/2's default: `*`, `?`
    # and `**` do not match them, a literal `.name` component still does.

    @doc false
    def list_dir(dir) do
      with {:ok, names} <- :file.list_dir(dir), do: {:ok, Enum.reject(names, &match?([?. | _], &1))}
    end

    @doc false
    def read_link_info(file), do: :file.read_link_info(file)
  end

  @spec glob(String.t(), String.t(), boolean()) :: {:ok, [String.t()]} | {:error, term()}
  def glob(cwd, pattern, match_dot?) do
    if String.contains?(pattern, <<0>>) do
      {:error, "a pattern cannot contain a NUL byte"}
    else
      files_module = if match_dot?, do: :file, else: NoDot
      paths = :filelib.wildcard(String.to_charlist(pattern), String.to_charlist(cwd), files_module)
      {:ok, paths |> Enum.map(&IO.chardata_to_string/1) |> Enum.sort()}
    end
  catch
    # :filelib raises on a malformed pattern such as "{a".
    :error, {:badpattern, why} -> {:error, why}
  end

  @spec grep(String.t(), String.t(), String.t(), map()) ::
          {:ok, [Condukt.Sandbox.grep_match()]} | {:error, {:invalid_pattern, term()} | File.posix() | :badarg}
  def grep(root, abs_root, pattern, opts) do
    with {:ok, matcher} <- matcher(pattern, opts),
         {:ok, files} <- files(root, abs_root, opts) do
      matches =
        files
        |> Stream.flat_map(fn {shown, abs} -> search_file(shown, abs, matcher) end)
        |> Enum.take(opts.max_matches)

      {:ok, matches}
    end
  end

  # Shared with Condukt.Sandbox.Virtual.Search, so both backends match the
  # same lines.
  @doc false
  @spec matcher(String.t(), map()) :: {:ok, (binary() -> boolean())} | {:error, {:invalid_pattern, String.t()}}
  def matcher(pattern, opts)

  def matcher("", %{literal: true}), do: {:ok, fn _line -> true end}

  def matcher(pattern, %{literal: true, ignore_case: false}) do
    compiled = :binary.compile_pattern(pattern)
    {:ok, fn line -> :binary.match(line, compiled) != :nomatch end}
  end

  def matcher(pattern, %{literal: true} = opts), do: matcher(Regex.escape(pattern), %{opts | literal: false})

  def matcher(pattern, opts) do
    case Regex.compile(pattern, if(opts.ignore_case, do: "i", else: "")) do
      {:ok, regex} -> {:ok, &Regex.match?(regex, &1)}
      {:error, {what, at}} -> {:error, {:invalid_pattern, "#{what} at position #{at}"}}
    end
  end

  # A lazy stream of {path as shown, absolute path} for every file to search.
  defp files(root, abs_root, opts) do
    case File.stat(abs_root) do
      {:ok, %File.Stat{type: :directory}} when is_map_key(opts, :glob) ->
        case glob(abs_root, opts.glob, opts.hidden) do
          {:ok, rels} -> {:ok, Stream.map(rels, &{shown(root, &1), Path.join(abs_root, &1)})}
          {:error, why} -> {:error, {:invalid_pattern, why}}
        end

      {:ok, %File.Stat{type: :directory}} ->
        {:ok, walk(root, abs_root, opts.hidden)}

      {:ok, _file} ->
        {:ok, [{root, abs_root}]}

      {:error, reason} ->
        {:error, reason}
    end
  end

  defp walk(shown_dir, abs_dir, hidden?) do
    case File.ls(abs_dir) do
      {:ok, names} ->
        names
        |> Enum.sort()
        |> Enum.reject(&(not hidden? and String.starts_with?(&1, ".")))
        |> Stream.flat_map(fn name ->
          shown = shown(shown_dir, name)
          abs = Path.join(abs_dir, name)

          case File.lstat(abs) do
            {:ok, %File.Stat{type: :directory}} -> walk(shown, abs, hidden?)
            {:ok, _} -> [{shown, abs}]
            {:error, _} -> []
          end
        end)

      {:error, _} ->
        []
    end
  end

  defp shown(".", name), do: name
  defp shown(dir, name), do: Path.join(dir, name)

  defp search_file(shown, abs, matcher) do
    with {:ok, %File.Stat{type: :regular, size: size}} when size <= @max_file_bytes <- File.stat(abs),
         {:ok, content} <- File.read(abs) do
      match_lines(shown, content, matcher)
    else
      _ -> []
    end
  end

  @doc false
  @spec match_lines(String.t(), binary(), (binary() -> boolean())) :: Enumerable.t()
  def match_lines(shown, content, matcher) do
    if binary?(content) do
      []
    else
      content
      |> :binary.split("\n", [:global])
      |> drop_final_empty()
      |> Stream.with_index(1)
      |> Stream.filter(fn {line, _} -> matcher.(line) end)
      |> Stream.map(fn {line, n} -> %{path: shown, line_number: n, line: display(line)} end)
    end
  end

  defp binary?(content),
    do: :binary.match(content, <<0>>, scope: {0, min(byte_size(content), @binary_sniff_bytes)}) != :nomatch

  defp drop_final_empty(lines) do
    case List.last(lines) do
      "" -> List.delete_at(lines, -1)
      _ -> lines
    end
  end

  defp display(line) do
    line = String.trim_trailing(line, "\r")

    if byte_size(line) > @max_line_bytes,
      do: binary_part(line, 0, @max_line_bytes) <> " […]",
      else: line
  end
end
