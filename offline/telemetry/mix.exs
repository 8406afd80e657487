defmodule ConduktOfflineTelemetry.MixProject do
  # OFFLINE STAND-IN for the `telemetry` library (README.md in this folder).
  # It is an OTP application of its own named :telemetry, so that it can
  # never sit beside the real package in one release: a build has exactly
  # one :telemetry application, the real one (with Hex) or this one.
  use Mix.Project

  def project do
    [
      app: :telemetry,
      # The documented telemetry 1.x API; "+condukt.offline" marks the build.
      version: "1.0.0+condukt.offline",
      language: :erlang,
      erlc_paths: ["src"],
      deps: []
    ]
  end

  def application do
    [mod: {:condukt_offline_telemetry_app, []}, extra_applications: [:logger]]
  end
end
