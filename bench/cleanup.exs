# Removes testbeds left by benchmark (or test) runs that are no longer
# running: bench/run.sh calls it after every run, also a failed or
# interrupted one.
Condukt.Dev.Netns.Testbed.sweep()
