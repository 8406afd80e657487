defmodule Condukt.Sandbox.Local.TrustedPath do
  @moduledoc false
  # Whether a file the BEAM runs or trusts with its full privileges (a tool
  # such as `ip`, the sidecar binary, the Mozilla roots) can be replaced by
  # anyone but root.
  #
  # A file can be replaced by whoever can write it, and by whoever can
  # write any directory on the way to it (rename the directory or the entry
  # in it), following symbolic links: a link itself cannot be changed, only
  # replaced in its directory, so it is the directories along the resolved
  # path that matter. So every directory from `/` down, every link target,
  # and the file must be owned by uid 0 and writable by nobody else: no
  # "other" write bit, and no group write bit unless the group is 0 (a
  # session never holds gid 0: Condukt.Sandbox.Local.Network refuses that
  # uid and clears supplementary groups). A sticky directory owned by root
  # (/tmp) may be passed through, never be the end: there only an entry's
  # owner (root, for every entry the walk goes on into) may rename or
  # remove it, and new entries others create there are never on the path.
  #
  # check/1 returns the path as given: the links on it live in directories
  # only root can change, so it keeps naming the file that was checked (and
  # a multi-call program such as iptables keeps the name it dispatches on).

  import Bitwise

  # Linux's own limit on links followed in one lookup (ELOOP).
  @max_links 40

  @doc false
  @spec check(Path.t()) :: {:ok, Path.t()} | {:error, String.t()}
  def check(path) do
    if Path.type(path) == :absolute do
      with :ok <- dir_ok("/"),
           :ok <- walk("/", Path.split(path) |> tl(), @max_links, path),
           do: {:ok, path}
    else
      {:error, "#{path} is not an absolute path"}
    end
  end

  defp walk(_at, [], _links, _orig), do: :ok

  defp walk(_at, _rest, 0, orig), do: {:error, "#{orig}: too many symbolic links"}

  # `.` stays, `..` goes up: the directories it goes back to were checked
  # on the way down (or are `/`).
  defp walk(at, ["." | rest], links, orig), do: walk(at, rest, links, orig)
  defp walk(at, [".." | rest], links, orig), do: walk(Path.dirname(at), rest, links, orig)

  defp walk(at, [part | rest], links, orig) do
    next = Path.join(at, part)

    case File.lstat(next) do
      {:ok, %File.Stat{type: :symlink}} ->
        # The target is resolved from `/` again (absolute) or from `at`.
        with {:ok, target} <- read_link(next) do
          case Path.type(target) do
            :absolute -> walk("/", tl(Path.split(target)) ++ rest, links - 1, orig)
            _ -> walk(at, Path.split(target) ++ rest, links - 1, orig)
          end
        end

      {:ok, %File.Stat{type: :directory} = st} ->
        with :ok <- owned(next, st, rest != []), do: walk(next, rest, links, orig)

      {:ok, %File.Stat{type: :regular} = st} when rest == [] ->
        owned(next, st)

      {:ok, %File.Stat{type: type}} ->
        {:error, "#{next} is a #{type}, not a directory or a regular file"}

      {:error, reason} ->
        {:error, "#{next}: #{:file.format_error(reason)}"}
    end
  end

  defp read_link(path) do
    case File.read_link(path) do
      {:ok, target} -> {:ok, target}
      {:error, reason} -> {:error, "#{path}: #{:file.format_error(reason)}"}
    end
  end

  defp dir_ok(dir) do
    case File.lstat(dir) do
      {:ok, st} -> owned(dir, st)
      {:error, reason} -> {:error, "#{dir}: #{:file.format_error(reason)}"}
    end
  end

  defp owned(path, st, passing_through? \\ false)

  defp owned(path, %File.Stat{uid: uid, gid: gid, mode: mode}, passing_through?) do
    cond do
      uid != 0 ->
        {:error, "#{path} belongs to uid #{uid}, not root"}

      passing_through? and (mode &&& 0o1000) != 0 ->
        :ok

      (mode &&& 0o002) != 0 ->
        {:error, "#{path} is writable by everyone (mode #{format_mode(mode)})"}

      (mode &&& 0o020) != 0 and gid != 0 ->
        {:error, "#{path} is writable by group #{gid} (mode #{format_mode(mode)})"}

      true ->
        :ok
    end
  end

  defp format_mode(mode), do: "0" <> Integer.to_string(mode &&& 0o7777, 8)
end
