defmodule Condukt.Test.Vectors do
  @moduledoc false
  # Loads native_test/vectors/policy_vectors.json, the shared oracle that the
  # C tests run too.

  @path Path.expand("../../native_test/vectors/policy_vectors.json", __DIR__)

  def path, do: @path
  def load!, do: @path |> File.read!() |> Condukt.JSON.decode!()

  # The Elixir form of a vector group's sidecar policy: decide rules get a
  # function callable, since the sidecar document carries none.
  # Version 3 credentials become {host, header:, value: {:secret, name}},
  # each secret a placeholder value (the vectors hold names, not values).
  def elixir_policy(%{"default" => default, "rules" => rules} = doc) do
    credentials = Enum.map(doc["credentials"] || [], &credential/1)

    %Condukt.Sandbox.NetworkPolicy{
      credentials: credentials,
      secrets: Map.new(credentials, fn {_, opts} -> {elem(opts[:value], 1), "placeholder"} end),
      default: String.to_existing_atom(default),
      rules:
        Enum.map(rules, fn
          %{"kind" => "decide", "timeout_ms" => t, "cache" => c} ->
            {:decide, [call: fn _ctx, _req -> :allow end, timeout: t, cache: c]}

          %{"kind" => kind, "hosts" => hosts} ->
            {String.to_existing_atom(kind), Enum.map(hosts, &entry/1)}
        end)
    }
  end

  # A version 2 entry object as the Elixir {host, methods: ..., paths: ...}.
  defp entry(%{"host" => host} = object) do
    {host,
     for({key, name} <- [methods: "methods", paths: "paths"], Map.has_key?(object, name), do: {key, object[name]})}
  end

  defp entry(host) when is_binary(host), do: host

  defp credential(%{"header" => header, "secret" => secret} = object) do
    {host, conditions} = entry(Map.drop(object, ["header", "secret"]))
    {host, [header: header, value: {:secret, secret}] ++ conditions}
  end
end
