defmodule Condukt.Dev.Netns.Tier do
  @moduledoc false
  # Decides whether the `:netns` end-to-end tier can run on this machine.
  #
  # The tier needs root (network namespaces, veth pairs, iptables inside a
  # namespace), the real servers and clients it drives, and a kernel that
  # lets us create a namespace at all: being uid 0 in a container without
  # CAP_SYS_ADMIN is not enough, so the check also creates and deletes a
  # throwaway namespace. The answer is computed once per VM and kept in
  # :persistent_term, because test_helper.exs and every tier module ask.
  #
  # DESIGN.md §9: a tier that cannot run is skipped with a printed reason,
  # never silently, and CONDUKT_REQUIRE_ALL_TIERS=1 turns the skip into a
  # failed run.

  alias Condukt.Dev.Netns.Cmd
  alias Condukt.Dev.SystemTools

  @key {__MODULE__, :check}

  # Programs looked up in the system directories only, never on the
  # caller's PATH: a user's pyenv or nvm shims must not stand in for
  # Debian's tools. Python is always Debian's, because its modules
  # (requests, websockets) come from Debian packages.
  # The package managers and the JVM are those of Debian's packages too
  # (scripts/setup-debian.sh).
  @programs ~w(ip iptables ip6tables nginx openssl curl git node setpriv setsid timeout ss sh kill) ++
              ~w(npm cargo go java mvn)
  @python "/usr/bin/python3"

  @doc "`:ok` or `{:skip, reason}`, computed once per VM."
  @spec check() :: :ok | {:skip, String.t()}
  def check, do: SystemTools.once(@key, &compute/0)

  @doc "The skip reason, or nil when the tier can run."
  @spec skip_reason() :: String.t() | nil
  def skip_reason do
    case check() do
      :ok -> nil
      {:skip, reason} -> reason
    end
  end

  @doc "Absolute paths of the programs the tier runs (`\"python3\"` is Debian's)."
  @spec tools() :: %{String.t() => String.t()}
  def tools do
    Map.new(@programs, &{&1, SystemTools.find(&1)})
    |> Map.put("python3", @python)
  end

  @doc "The absolute path of one tool; raises when it is missing."
  @spec tool!(String.t()) :: String.t()
  def tool!(name), do: tools()[name] || raise("netns tier: `#{name}` not found")

  @doc """
  Called from test/test_helper.exs before `ExUnit.start/1`. When the tier
  cannot run it prints why and excludes `:netns`; with
  CONDUKT_REQUIRE_ALL_TIERS=1 it fails the run instead. (`mix test --only
  netns` re-applies its include after test_helper.exs, so
  `Condukt.Test.Netns.Case` also tags the tier's modules `:skip` with the
  same reason: they are reported as skipped, never run.)
  """
  @spec configure_exunit() :: :ok
  def configure_exunit, do: SystemTools.configure_tier(:netns, check())

  defp compute do
    with :ok <- check_root(),
         :ok <- check_programs(),
         :ok <- check_python(),
         :ok <- check_nginx(),
         :ok <- check_git_http_backend() do
      check_namespaces()
    end
  end

  defp check_root do
    case System.cmd("id", ["-u"]) do
      {"0\n", 0} -> :ok
      {uid, _} -> {:skip, "needs root (running as uid #{String.trim(uid)})"}
    end
  end

  defp check_programs do
    with :ok <- SystemTools.require(@programs) do
      if File.exists?(@python), do: :ok, else: {:skip, "missing programs: #{@python}"}
    end
  end

  defp check_python do
    case System.cmd(@python, ["-c", "import requests, websockets"], stderr_to_stdout: true) do
      {_, 0} -> :ok
      {out, _} -> {:skip, "#{@python} lacks requests/websockets (python3-requests, python3-websockets): #{out}"}
    end
  end

  defp check_nginx do
    {out, _} = System.cmd(tool!("nginx"), ["-V"], stderr_to_stdout: true)

    case Enum.reject(~w(--with-http_ssl_module --with-http_v2_module), &String.contains?(out, &1)) do
      [] -> :ok
      missing -> {:skip, "nginx was built without #{Enum.join(missing, ", ")} (install nginx-light)"}
    end
  end

  defp check_git_http_backend do
    {exec_path, 0} = System.cmd(tool!("git"), ["--exec-path"])

    if File.exists?(Path.join(String.trim(exec_path), "git-http-backend")),
      do: :ok,
      else: {:skip, "git-http-backend not found under `git --exec-path`"}
  end

  # Creates a namespace, brings its loopback up and lists its nat table
  # with iptables and ip6tables, then deletes it.
  defp check_namespaces do
    ns = "ce-probe-#{:crypto.strong_rand_bytes(4) |> Base.encode16(case: :lower)}"
    ip = tool!("ip")

    steps = [
      [ip, "netns", "add", ns],
      [ip, "-n", ns, "link", "set", "lo", "up"],
      [ip, "netns", "exec", ns, tool!("iptables"), "-t", "nat", "-S"],
      [ip, "netns", "exec", ns, tool!("ip6tables"), "-t", "nat", "-S"]
    ]

    try do
      Enum.reduce_while(steps, :ok, fn argv, :ok ->
        case Cmd.run(argv, timeout: 10_000) do
          {_, 0} -> {:cont, :ok}
          {out, s} -> {:halt, {:skip, "`#{Enum.join(argv, " ")}` failed (exit #{s}): #{String.trim(out)}"}}
        end
      end)
    after
      # Also when a step raised: the probe never outlives the check.
      Cmd.run([ip, "netns", "del", ns], timeout: 10_000)
    end
  end
end
