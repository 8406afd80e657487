# Removes testbeds left by benchmark (or test) runs that are no longer
# running: bench/run.sh calls it after every run, also a failed or
# interrupted one.
Code.require_file(Path.join([__DIR__, "..", "test", "support", "system_tools.ex"]))

for file <- ~w(cmd tier pki nginx client testbed) do
  Code.require_file(Path.join([__DIR__, "..", "test", "support", "netns", file <> ".ex"]))
end

Condukt.Test.Netns.Testbed.sweep()
