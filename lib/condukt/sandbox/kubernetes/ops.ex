defmodule Condukt.Sandbox.Kubernetes.Ops do
  @moduledoc false
  # The file and process operations of Condukt.Sandbox.Kubernetes, each one
  # pods/exec into the `workspace` container with an argv (docs/kubernetes.md,
  # "Operations inside the pod"). Paths, patterns and commands travel as
  # separate argv elements or through stdin; the few fixed shell scripts
  # below read them only as "$1", "$2", ..., so nothing can inject.

  alias Condukt.Kube
  alias Condukt.Sandbox.Error
  alias Condukt.Sandbox.Kubernetes.Glob

  @container "workspace"
  # write_file/3 sends content in pieces of this size.
  @piece 8 * 1024 * 1024
  # The port keeps at most 15 MiB of a stream per exec: read_file/2
  # reads in pieces of this size, up to @max_read in all.
  @read_piece 15 * 1024 * 1024
  @max_read 256 * 1024 * 1024
  # What the listing commands (find, grep) keep of stdout.
  @max_list 15 * 1024 * 1024
  # Added to a command's own timeout for the client's.
  @margin 15_000
  @op_timeout 120_000
  @max_line_bytes 1_000

  # exec: cd to "$1" (reporting why not on stderr, which the command never
  # writes: its stderr goes to stdout), then run "$2" with stdout and
  # stderr interleaved, stdin /dev/null.
  @exec_script ~S"""
  cd -- "$1" 2>/dev/null || { if [ -e "$1" ]; then echo 'condukt:enotdir' >&2; else echo 'condukt:enoent' >&2; fi; exit 1; }
  exec /bin/sh -c "$2" </dev/null 2>&1
  """

  # write: "$1" path, "$2" byte count, "$3" ">" or ">>".
  @write_script ~S"""
  mkdir -p -- "$(dirname -- "$1")" || exit 1
  if [ "$3" = '>>' ]; then head -c "$2" >> "$1"; else head -c "$2" > "$1"; fi
  """

  @typedoc "What the operations need of the sandbox state."
  @type target :: %{
          required(:kube) => Kube.t(),
          required(:namespace) => String.t(),
          required(:pod) => String.t(),
          required(:cwd) => String.t(),
          optional(atom()) => term()
        }

  ## exec -----------------------------------------------------------------------

  @spec exec(target(), String.t(), keyword(), pos_integer(), pos_integer()) ::
          {:ok, Condukt.Sandbox.exec_result()} | {:error, Error.t()}
  def exec(t, command, opts, default_timeout, default_max) do
    timeout = opts[:timeout] || default_timeout
    max = opts[:max_output_bytes] || default_max
    dir = resolve(t, opts[:cwd] || t.cwd)

    cond do
      String.contains?(command, <<0>>) ->
        {:error, %Error{reason: :invalid_command, op: :exec}}

      String.contains?(dir, <<0>>) ->
        {:error, %Error{reason: :invalid_path, op: :exec, path: opts[:cwd]}}

      true ->
        argv =
          ["timeout", "-s", "KILL", seconds(timeout)] ++
            env_argv(opts[:env] || []) ++ ["/bin/sh", "-c", @exec_script, "sh", dir, command]

        started = System.monotonic_time(:millisecond)

        case run(t, argv, timeout: timeout + @margin, max_output: max) do
          {:ok, %{exit_code: code} = r} when is_integer(code) ->
            output = output(r.stdout, r.stdout_dropped, max)
            elapsed = System.monotonic_time(:millisecond) - started

            cond do
              code == 1 and r.stderr =~ "condukt:enoent" ->
                {:error, %Error{reason: :enoent, op: :exec, path: opts[:cwd]}}

              code == 1 and r.stderr =~ "condukt:enotdir" ->
                {:error, %Error{reason: :enotdir, op: :exec, path: opts[:cwd]}}

              code == 137 and elapsed >= timeout ->
                {:error,
                 %Error{reason: :timeout, op: :exec, path: opts[:cwd], detail: %{timeout: timeout, output: output}}}

              code in [126, 127] and r.stdout == "" and r.stderr != "" ->
                {:error, %Error{reason: :spawn_failed, op: :exec, path: opts[:cwd], detail: String.trim(r.stderr)}}

              true ->
                {:ok, %{output: output, exit_code: code}}
            end

          # Runtimes that report a killed command only as a Status
          # ("signal: killed") give no exit code.
          {:ok, r} ->
            if System.monotonic_time(:millisecond) - started >= timeout do
              output = output(r.stdout, r.stdout_dropped, max)

              {:error,
               %Error{reason: :timeout, op: :exec, path: opts[:cwd], detail: %{timeout: timeout, output: output}}}
            else
              {:error, %Error{reason: :spawn_failed, op: :exec, path: opts[:cwd], detail: r.status}}
            end

          {:error, %Kube.Error{reason: :timeout}} ->
            {:error, %Error{reason: :timeout, op: :exec, path: opts[:cwd], detail: %{timeout: timeout, output: ""}}}

          {:error, e} ->
            {:error, %Error{reason: :backend, op: :exec, path: opts[:cwd], detail: e}}
        end
    end
  end

  defp seconds(ms), do: :erlang.float_to_binary(ms / 1000, decimals: 3)

  defp env_argv([]), do: []

  defp env_argv(env) when is_map(env) and map_size(env) == 0, do: []

  # `env -u NAME... -- NAME=VALUE...`: after "--" nothing is an option, so
  # a name that starts with "-" stays a name.
  defp env_argv(env) do
    {unset, set} = Enum.split_with(env, fn {_k, v} -> v == nil end)

    ["env"] ++
      Enum.flat_map(unset, fn {k, nil} -> ["-u", k] end) ++ ["--"] ++ Enum.map(set, fn {k, v} -> "#{k}=#{v}" end)
  end

  defp output(out, 0, _max), do: out

  defp output(out, dropped, max),
    do: out <> "\n[condukt: output truncated: kept the first #{max} bytes, dropped #{dropped} more]\n"

  ## files ----------------------------------------------------------------------

  @spec read_file(target(), String.t()) :: {:ok, binary()} | {:error, Error.t()}
  def read_file(t, path) do
    with :ok <- check_path(path, :read) do
      read_from(t, path, resolve(t, path), ["cat", "--", resolve(t, path)], [])
    end
  end

  # A file larger than one exec's stream is read on with `tail -c +N`.
  defp read_from(t, path, abs, argv, acc) do
    case run(t, argv, max_output: @read_piece) do
      {:ok, %{exit_code: 0, stdout_dropped: 0, stdout: content}} ->
        {:ok, IO.iodata_to_binary([acc | content])}

      {:ok, %{exit_code: 0, stdout: content}} ->
        acc = [acc | content]
        offset = IO.iodata_length(acc)

        if offset >= @max_read,
          do: {:error, %Error{reason: :efbig, op: :read, path: path}},
          else: read_from(t, path, abs, ["tail", "-c", "+#{offset + 1}", "--", abs], acc)

      {:ok, r} ->
        {:error, %Error{reason: posix(r.stderr), op: :read, path: path, detail: detail(r)}}

      {:error, e} ->
        {:error, %Error{reason: :backend, op: :read, path: path, detail: e}}
    end
  end

  @spec write_file(target(), String.t(), binary()) :: :ok | {:error, Error.t()}
  def write_file(t, path, content) do
    with :ok <- check_path(path, :write) do
      abs = resolve(t, path)

      content
      |> pieces()
      |> Enum.with_index()
      |> Enum.reduce_while(:ok, fn {piece, i}, :ok ->
        mode = if i == 0, do: ">", else: ">>"
        argv = ["/bin/sh", "-c", @write_script, "sh", abs, Integer.to_string(byte_size(piece)), mode]

        case run(t, argv, stdin: piece) do
          {:ok, %{exit_code: 0}} -> {:cont, :ok}
          {:ok, r} -> {:halt, {:error, %Error{reason: posix(r.stderr), op: :write, path: path, detail: detail(r)}}}
          {:error, e} -> {:halt, {:error, %Error{reason: :backend, op: :write, path: path, detail: e}}}
        end
      end)
    end
  end

  defp pieces(<<>>), do: [<<>>]
  defp pieces(content) when byte_size(content) <= @piece, do: [content]
  defp pieces(<<piece::binary-size(@piece), rest::binary>>), do: [piece | pieces(rest)]

  @spec edit_file(target(), String.t(), binary(), binary()) :: :ok | {:error, Error.t()}
  def edit_file(t, path, old_text, new_text) do
    with {:ok, content} <- error_op(read_file(t, path), :edit) do
      with {:ok, updated} <- Condukt.Sandbox.Backend.replace_once(content, old_text, new_text, path),
           do: error_op(write_file(t, path, updated), :edit)
    end
  end

  defp error_op({:error, %Error{} = e}, op), do: {:error, %{e | op: op}}
  defp error_op(other, _op), do: other

  ## glob and grep ---------------------------------------------------------------

  @spec glob(target(), String.t(), keyword()) :: {:ok, [String.t()]} | {:error, Error.t()}
  def glob(t, pattern, opts) do
    if String.contains?(pattern, <<0>>) do
      {:error,
       %Error{reason: :invalid_pattern, op: :glob, path: pattern, detail: "a pattern cannot contain a NUL byte"}}
    else
      case list_matching(t, t.cwd, pattern, opts[:match_dot]) do
        {:ok, paths} ->
          {:ok, paths |> Enum.sort() |> Enum.take(opts[:max_results])}

        {:error, {:invalid_pattern, why}} ->
          {:error, %Error{reason: :invalid_pattern, op: :glob, path: pattern, detail: why}}

        {:error, e} ->
          {:error, %Error{reason: :backend, op: :glob, path: pattern, detail: e}}
      end
    end
  end

  # The paths under `root` matching `pattern` (relative to root when the
  # pattern is relative), listed by `find` and matched here.
  defp list_matching(t, root, pattern, match_dot?) do
    absolute? = String.starts_with?(pattern, "/")
    rel = if absolute?, do: String.trim_leading(pattern, "/"), else: pattern
    base_root = if absolute?, do: "/", else: resolve(t, root)

    with {:ok, {literal, regex, depth}} <- wrap_pattern(Glob.compile(rel, match_dot?)) do
      start = if literal == "", do: base_root, else: Path.join(base_root, literal)
      depth_args = if depth, do: ["-maxdepth", Integer.to_string(depth)], else: []
      argv = ["find", start, "-mindepth", "1"] ++ depth_args ++ ["-print0"]

      case run(t, argv, max_output: @max_list) do
        {:ok, %{stdout: out}} ->
          prefix = if String.ends_with?(base_root, "/"), do: base_root, else: base_root <> "/"

          paths =
            out
            |> :binary.split(<<0>>, [:global, :trim_all])
            |> Enum.flat_map(fn abs ->
              if String.starts_with?(abs, prefix),
                do: [binary_part(abs, byte_size(prefix), byte_size(abs) - byte_size(prefix))],
                else: []
            end)
            |> Enum.filter(&Regex.match?(regex, &1))
            |> Enum.map(fn relpath -> if absolute?, do: "/" <> relpath, else: relpath end)

          {:ok, paths}

        {:error, e} ->
          {:error, e}
      end
    end
  end

  defp wrap_pattern({:ok, _} = ok), do: ok
  defp wrap_pattern({:error, why}), do: {:error, {:invalid_pattern, why}}

  @spec grep(target(), String.t(), keyword()) :: {:ok, [Condukt.Sandbox.grep_match()]} | {:error, Error.t()}
  def grep(t, pattern, opts) do
    root = opts[:path]
    abs_root = resolve(t, root)

    with :ok <- check_grep_pattern(pattern, opts),
         {:ok, files} <- grep_files(t, root, abs_root, opts) do
      flags =
        ["-n", "-I", "-H", "--null", "--no-messages"] ++
          if(opts[:literal], do: ["-F"], else: ["-P"]) ++
          if(opts[:ignore_case], do: ["-i"], else: [])

      # Hidden files are dropped below rather than with --exclude-dir=.*,
      # which grep also applies to every suffix of the root's own path.
      keep? = fn file -> opts[:hidden] or files != :recursive or not hidden_below?(file, abs_root) end

      argvs =
        case files do
          :recursive -> [["grep", "-r" | flags] ++ ["-e", pattern, "--", abs_root]]
          [] -> []
          list -> list |> Enum.chunk_every(500) |> Enum.map(&(["grep" | flags] ++ ["-e", pattern, "--" | &1]))
        end

      Enum.reduce_while(argvs, {:ok, []}, fn argv, {:ok, acc} ->
        case run(t, argv, max_output: @max_list) do
          {:ok, %{exit_code: code} = r} when code in [0, 1] or (code == 2 and r.stdout != "") ->
            {:cont, {:ok, acc ++ parse_grep(r.stdout, root, abs_root, keep?)}}

          {:ok, %{exit_code: 2, stderr: ""}} ->
            # --no-messages: the root is missing or unreadable.
            {:halt, {:error, %Error{reason: root_error(t, abs_root), op: :grep, path: root}}}

          {:ok, r} ->
            {:halt, {:error, %Error{reason: posix(r.stderr), op: :grep, path: root, detail: detail(r)}}}

          {:error, e} ->
            {:halt, {:error, %Error{reason: :backend, op: :grep, path: root, detail: e}}}
        end
      end)
      |> case do
        {:ok, matches} -> {:ok, matches |> Enum.sort_by(&Path.split(&1.path)) |> Enum.take(opts[:max_matches])}
        error -> error
      end
    end
  end

  defp check_grep_pattern(pattern, opts) do
    cond do
      String.contains?(pattern, <<0>>) ->
        {:error,
         %Error{reason: :invalid_pattern, op: :grep, path: pattern, detail: "a pattern cannot contain a NUL byte"}}

      String.contains?(pattern, "\n") ->
        # grep reads a newline as two patterns; Local matches line by line,
        # so a pattern with a newline can never match.
        {:error, %Error{reason: :invalid_pattern, op: :grep, path: pattern, detail: "a pattern cannot span lines"}}

      opts[:literal] ->
        :ok

      true ->
        case Regex.compile(pattern, if(opts[:ignore_case], do: "i", else: "")) do
          {:ok, _} ->
            :ok

          {:error, {what, at}} ->
            {:error, %Error{reason: :invalid_pattern, op: :grep, path: pattern, detail: "#{what} at position #{at}"}}
        end
    end
  end

  defp grep_files(t, root, abs_root, opts) do
    case opts[:glob] do
      nil ->
        {:ok, :recursive}

      glob ->
        case list_matching(t, abs_root, glob, opts[:hidden]) do
          {:ok, rels} ->
            {:ok, Enum.map(rels, &Path.join(abs_root, &1))}

          {:error, {:invalid_pattern, why}} ->
            {:error, %Error{reason: :invalid_pattern, op: :grep, path: glob, detail: why}}

          {:error, e} ->
            {:error, %Error{reason: :backend, op: :grep, path: root, detail: e}}
        end
    end
  end

  defp root_error(t, abs_root) do
    case run(t, ["test", "-e", abs_root]) do
      {:ok, %{exit_code: 0}} -> :eacces
      _ -> :enoent
    end
  end

  defp hidden_below?(file, abs_root) do
    rel =
      if String.starts_with?(file, abs_root <> "/"),
        do: binary_part(file, byte_size(abs_root) + 1, byte_size(file) - byte_size(abs_root) - 1),
        else: ""

    rel |> String.split("/") |> Enum.any?(&String.starts_with?(&1, "."))
  end

  defp parse_grep(out, root, abs_root, keep?) do
    out
    |> :binary.split("\n", [:global, :trim_all])
    |> Enum.flat_map(fn record ->
      with [file, rest] <- :binary.split(record, <<0>>),
           true <- keep?.(file),
           [n, line] <- :binary.split(rest, ":"),
           {n, ""} <- Integer.parse(n) do
        [%{path: shown(root, abs_root, file), line_number: n, line: display(line)}]
      else
        _ -> []
      end
    end)
  end

  defp shown(root, abs_root, file) do
    cond do
      file == abs_root ->
        root

      String.starts_with?(file, abs_root <> "/") ->
        rel = binary_part(file, byte_size(abs_root) + 1, byte_size(file) - byte_size(abs_root) - 1)
        if root == ".", do: rel, else: Path.join(root, rel)

      true ->
        file
    end
  end

  defp display(line) do
    line = String.trim_trailing(line, "\r")

    if byte_size(line) > @max_line_bytes,
      do: binary_part(line, 0, @max_line_bytes) <> " […]",
      else: line
  end

  ## helpers ----------------------------------------------------------------------

  @doc false
  def run(t, argv, opts \\ []) do
    opts = Keyword.put_new(opts, :timeout, @op_timeout)
    Kube.exec(t.kube, t.namespace, t.pod, @container, argv, opts)
  end

  @doc false
  def resolve(%{cwd: cwd}, path) do
    case Path.type(path) do
      :absolute -> path
      _ -> Path.join(cwd, path)
    end
  end

  defp check_path(path, op) do
    if path == "" or String.contains?(path, <<0>>),
      do: {:error, %Error{reason: :invalid_path, op: op, path: path}},
      else: :ok
  end

  defp detail(%{stderr: stderr, exit_code: code}), do: %{exit_code: code, stderr: String.trim(stderr)}

  @doc false
  # The POSIX reason in a coreutils / sh error message.
  @spec posix(String.t()) :: atom()
  def posix(stderr) do
    cond do
      stderr =~ "No such file or directory" -> :enoent
      stderr =~ "Permission denied" -> :eacces
      stderr =~ "Not a directory" -> :enotdir
      stderr =~ "Is a directory" -> :eisdir
      stderr =~ "Read-only file system" -> :erofs
      stderr =~ "No space left" -> :enospc
      stderr =~ "File exists" -> :eexist
      stderr =~ "Too many levels of symbolic links" -> :eloop
      stderr =~ "File name too long" -> :enametoolong
      true -> :eio
    end
  end
end
