defmodule Condukt.Sandbox.Virtual.Native do
  @moduledoc false
  # The NIF of Condukt.Sandbox.Virtual (native/condukt_virtual, Rust), loaded
  # with :erlang.load_nif/2 from priv/condukt_virtual.so when this module
  # loads. A missing or unloadable library is not an error here: every
  # function below then raises, and available/0 says why, so that
  # Condukt.Sandbox.Virtual can answer {:error, :not_available} and the rest of
  # the library works without Rust.
  #
  # The messages the library sends are documented at the top of
  # native/condukt_virtual/src/exec.rs and net.rs.

  @on_load :load

  @build_hint "build it with `make virtual-nif` (needs cargo, the Rust toolchain; `mix compile` runs it when cargo is on the PATH)"

  @doc false
  def load do
    path = library_path()

    status =
      case :erlang.load_nif(String.to_charlist(path), 0) do
        :ok -> :ok
        {:error, {:reload, _}} -> :ok
        {:error, {_reason, text}} -> {:error, "#{path}.so could not be loaded (#{text}); #{@build_hint}"}
      end

    :persistent_term.put({__MODULE__, :status}, status)
    # Loading the module never fails on the NIF's account.
    :ok
  end

  # CONDUKT_VIRTUAL_NIF names another build (without the .so suffix).
  defp library_path do
    case System.get_env("CONDUKT_VIRTUAL_NIF") do
      nil -> Path.join(:code.priv_dir(:condukt) |> to_string(), "condukt_virtual")
      path -> path
    end
  end

  @doc false
  @spec available() :: :ok | {:error, String.t()}
  def available, do: :persistent_term.get({__MODULE__, :status}, {:error, "the NIF was never loaded; #{@build_hint}"})

  @doc false
  def new(_fs_options, _policy_link, _http_options), do: :erlang.nif_error(:not_loaded)
  @doc false
  def mount(_sb, _host, _at, _readonly, _within), do: :erlang.nif_error(:not_loaded)
  @doc false
  def read_file(_sb, _path), do: :erlang.nif_error(:not_loaded)
  @doc false
  def write_file(_sb, _path, _content), do: :erlang.nif_error(:not_loaded)
  @doc false
  def mkdir_p(_sb, _path), do: :erlang.nif_error(:not_loaded)
  @doc false
  def stat(_sb, _path), do: :erlang.nif_error(:not_loaded)
  @doc false
  def list_dir(_sb, _path), do: :erlang.nif_error(:not_loaded)
  @doc false
  def exec(_sb, _script, _opts, _reply_to, _tag), do: :erlang.nif_error(:not_loaded)
  @doc false
  def cancel(_handle), do: :erlang.nif_error(:not_loaded)
  @doc false
  def policy_link(_owner), do: :erlang.nif_error(:not_loaded)
  @doc false
  def http_reply(_link, _id, _verdict), do: :erlang.nif_error(:not_loaded)
end
