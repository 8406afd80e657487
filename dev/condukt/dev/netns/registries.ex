defmodule Condukt.Dev.Netns.Registries do
  @moduledoc false
  # Package registries of the testbed's internet, as static layouts that
  # nginx serves over HTTPS under one name (registry.test): an npm
  # registry, a PyPI simple index, a cargo sparse index, a Go module proxy
  # and a Maven repository, each holding one small package built here, on
  # the BEAM, in the format the real tool checks (tarball integrity,
  # wheel RECORD, crate checksum, module zip layout, Maven checksums).
  # Nothing is downloaded. docs/e2e-testbed.md lists the paths.
  #
  # `build!/2` writes the trees under a site's document root and returns
  # what a test needs: the package names and versions, and for each tool
  # the files (.npmrc, pip's index URL, cargo's config, GOPROXY, Maven's
  # settings) that point it at a registry host.

  @host "registry.test"
  @time "2024-01-01T00:00:00Z"

  @npm %{name: "condukt-hello", version: "1.0.0"}
  @pypi %{name: "condukt-hello", version: "0.1.0", module: "condukt_hello"}
  @crate %{name: "condukt-hello", version: "0.1.0"}
  @go %{module: "registry.test/hello", version: "v1.0.0"}
  @maven %{group: "org.condukt.test", artifact: "hello", version: "1.0"}

  @doc "The registry host."
  def host, do: @host

  @doc "The packages each registry holds."
  def packages, do: %{npm: @npm, pypi: @pypi, cargo: @crate, go: @go, maven: @maven}

  @doc """
  Writes the five registries under `root` (the document root of
  registry.test). Returns `%{npm:, pypi:, cargo:, go:, maven:}` with the
  base path of each and the hashes a test can check.
  """
  @spec build!(Path.t()) :: map()
  def build!(root) do
    %{
      npm: npm!(Path.join(root, "npm")),
      pypi: pypi!(Path.join(root, "pypi")),
      cargo: cargo!(Path.join(root, "crates")),
      go: go!(Path.join(root, "go")),
      maven: maven!(Path.join(root, "maven"))
    }
  end

  ## npm: GET /npm/<name> (the packument, JSON) and the tarball it names.

  defp npm!(dir) do
    %{name: name, version: v} = @npm

    tgz =
      targz([
        {"package/package.json",
         json(%{"name" => name, "version" => v, "main" => "index.js", "license" => "MIT", "description" => "condukt"})},
        {"package/index.js", "module.exports = () => 'hello from #{name} #{v}';\n"}
      ])

    tarball = "#{name}-#{v}.tgz"
    write!(Path.join([dir, name, "-", tarball]), tgz)

    packument = %{
      "name" => name,
      "dist-tags" => %{"latest" => v},
      "versions" => %{
        v => %{
          "name" => name,
          "version" => v,
          "main" => "index.js",
          "dist" => %{
            "tarball" => "https://#{@host}/npm/#{name}/-/#{tarball}",
            "shasum" => hex(:crypto.hash(:sha, tgz)),
            "integrity" => "sha512-" <> Base.encode64(:crypto.hash(:sha512, tgz))
          }
        }
      }
    }

    # nginx answers /npm/<name> with <name>/index.json (try_files).
    write!(Path.join([dir, name, "index.json"]), json(packument))
    %{path: "/npm/", sha512: :crypto.hash(:sha512, tgz) |> hex()}
  end

  @doc "An .npmrc that points npm at the registry on `host`."
  def npmrc(host), do: "registry=https://#{host}/npm/\naudit=false\nfund=false\nupdate-notifier=false\n"

  ## PyPI: the simple index (PEP 503) and a wheel (PEP 427).

  defp pypi!(dir) do
    %{name: name, version: v, module: mod} = @pypi
    dist = "#{mod}-#{v}.dist-info"

    files = [
      {"#{mod}/__init__.py", "def hello():\n    return 'hello from #{name} #{v}'\n"},
      {"#{dist}/METADATA", "Metadata-Version: 2.1\nName: #{name}\nVersion: #{v}\nSummary: condukt\n"},
      {"#{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: condukt\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    ]

    record =
      Enum.map_join(files, "", fn {path, data} ->
        "#{path},sha256=#{Base.url_encode64(:crypto.hash(:sha256, data), padding: false)},#{byte_size(data)}\n"
      end) <> "#{dist}/RECORD,,\n"

    wheel_name = "#{mod}-#{v}-py3-none-any.whl"
    whl = zip(files ++ [{"#{dist}/RECORD", record}])
    write!(Path.join([dir, "files", wheel_name]), whl)
    sha = hex(:crypto.hash(:sha256, whl))

    write!(
      Path.join([dir, "simple", name, "index.html"]),
      "<!DOCTYPE html>\n<html><body>\n<a href=\"../../files/#{wheel_name}#sha256=#{sha}\">#{wheel_name}</a>\n</body></html>\n"
    )

    write!(
      Path.join([dir, "simple", "index.html"]),
      "<!DOCTYPE html>\n<html><body><a href=\"#{name}/\">#{name}</a></body></html>\n"
    )

    %{path: "/pypi/simple/", sha256: sha}
  end

  @doc "pip's index URL on `host`."
  def pip_index(host), do: "https://#{host}/pypi/simple/"

  ## cargo: a sparse index (config.json, index files) and .crate downloads.

  defp cargo!(dir) do
    %{name: name, version: v} = @crate

    crate =
      targz([
        {"#{name}-#{v}/Cargo.toml", "[package]\nname = \"#{name}\"\nversion = \"#{v}\"\nedition = \"2021\"\n"},
        {"#{name}-#{v}/src/lib.rs", "pub fn hello() -> &'static str {\n    \"hello from #{name} #{v}\"\n}\n"}
      ])

    cksum = hex(:crypto.hash(:sha256, crate))
    write!(Path.join([dir, "dl", name, v, "download"]), crate)

    write!(
      Path.join([dir, "index", "config.json"]),
      json(%{"dl" => "https://#{@host}/crates/dl/{crate}/{version}/download"})
    )

    line = %{"name" => name, "vers" => v, "deps" => [], "cksum" => cksum, "features" => %{}, "yanked" => false}
    write!(Path.join([dir, "index", index_path(name)]), json(line) <> "\n")
    %{path: "/crates/index/", cksum: cksum}
  end

  # Cargo's index layout: 1/, 2/, 3/<first char>/, then ab/cd/.
  defp index_path(name) do
    case String.length(name) do
      n when n <= 2 -> Path.join("#{n}", name)
      3 -> Path.join(["3", String.first(name), name])
      _ -> Path.join([String.slice(name, 0, 2), String.slice(name, 2, 2), name])
    end
  end

  @doc """
  A cargo project (Cargo.toml, src/lib.rs, .cargo/config.toml) that
  depends on the crate, its crates.io source replaced by the sparse index
  on `host`, written to `dir` (cargo reads .cargo/config.toml from its
  working directory up: run it in `dir`).
  """
  def cargo_project!(dir, host) do
    %{name: name, version: v} = @crate

    write!(
      Path.join(dir, "Cargo.toml"),
      "[package]\nname = \"app\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[dependencies]\n#{name} = \"=#{v}\"\n"
    )

    write!(Path.join([dir, "src", "lib.rs"]), "")

    write!(
      Path.join([dir, ".cargo", "config.toml"]),
      "[source.crates-io]\nreplace-with = \"testbed\"\n\n[source.testbed]\nregistry = \"sparse+https://#{host}/crates/index/\"\n\n" <>
        "[net]\nretry = 0\n"
    )

    dir
  end

  ## Go: the module proxy protocol (list, .info, .mod, .zip).

  defp go!(dir) do
    %{module: mod, version: v} = @go
    base = Path.join([dir, mod, "@v"])
    gomod = "module #{mod}\n\ngo 1.19\n"

    zip =
      zip([
        {"#{mod}@#{v}/go.mod", gomod},
        {"#{mod}@#{v}/hello.go",
         "package hello\n\n// Hello greets.\nfunc Hello() string { return \"hello from #{mod} #{v}\" }\n"}
      ])

    write!(Path.join(base, "list"), v <> "\n")
    write!(Path.join(base, "#{v}.info"), json(%{"Version" => v, "Time" => @time}))
    write!(Path.join(base, "#{v}.mod"), gomod)
    write!(Path.join(base, "#{v}.zip"), zip)
    %{path: "/go", module: mod}
  end

  @doc "GOPROXY for `host`."
  def goproxy(host), do: "https://#{host}/go"

  ## Maven: a repository layout with checksums and metadata.

  defp maven!(dir) do
    %{group: g, artifact: a, version: v} = @maven
    # Maven adds plexus-utils 1.1 to every build extension that does not
    # name it: the repository holds a stand-in (an empty jar) for it.
    _ = maven_artifact!(dir, "org.codehaus.plexus", "plexus-utils", "1.1")
    maven_artifact!(dir, g, a, v)
  end

  defp maven_artifact!(dir, g, a, v) do
    base = Path.join([dir | String.split(g, ".")] ++ [a])

    pom =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<project xmlns=\"http://maven.apache.org/POM/4.0.0\">\n" <>
        "  <modelVersion>4.0.0</modelVersion>\n  <groupId>#{g}</groupId>\n  <artifactId>#{a}</artifactId>\n" <>
        "  <version>#{v}</version>\n  <packaging>jar</packaging>\n</project>\n"

    jar =
      zip([
        {"META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\nCreated-By: condukt\r\n\r\n"},
        {"META-INF/condukt/#{a}.txt", "hello from #{g}:#{a}:#{v}\n"}
      ])

    metadata =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<metadata>\n  <groupId>#{g}</groupId>\n  <artifactId>#{a}</artifactId>\n" <>
        "  <versioning>\n    <latest>#{v}</latest>\n    <release>#{v}</release>\n    <versions><version>#{v}</version></versions>\n" <>
        "    <lastUpdated>20240101000000</lastUpdated>\n  </versioning>\n</metadata>\n"

    for {path, data} <- [
          {Path.join([base, v, "#{a}-#{v}.pom"]), pom},
          {Path.join([base, v, "#{a}-#{v}.jar"]), jar},
          {Path.join(base, "maven-metadata.xml"), metadata}
        ] do
      write!(path, data)
      write!(path <> ".sha1", hex(:crypto.hash(:sha, data)))
    end

    %{path: "/maven", jar_sha1: hex(:crypto.hash(:sha, jar))}
  end

  @doc """
  A Maven project in `dir` that needs the artifact as a build extension
  (resolved while Maven reads the project, before any plugin, so
  `mvn validate` downloads the artifact and nothing else), and a
  settings.xml whose mirror sends every repository to `host`. Returns the
  settings path.
  """
  def maven_project!(dir, host) do
    %{group: g, artifact: a, version: v} = @maven

    write!(
      Path.join(dir, "pom.xml"),
      "<project xmlns=\"http://maven.apache.org/POM/4.0.0\">\n  <modelVersion>4.0.0</modelVersion>\n" <>
        "  <groupId>app</groupId>\n  <artifactId>app</artifactId>\n  <version>0</version>\n" <>
        "  <build><extensions><extension><groupId>#{g}</groupId><artifactId>#{a}</artifactId>" <>
        "<version>[#{v},2)</version></extension></extensions></build>\n</project>\n"
    )

    settings = Path.join(dir, "settings.xml")

    write!(
      settings,
      "<settings>\n  <mirrors>\n    <mirror><id>testbed</id><mirrorOf>*</mirrorOf><url>https://#{host}/maven</url></mirror>\n" <>
        "  </mirrors>\n</settings>\n"
    )

    settings
  end

  @doc """
  A Java program that GETs its argument with the JDK's own HttpClient and
  prints the status and the body, compiled with Debian's javac into
  `dir`: run it as `java -cp DIR Fetch URL`. Returns `dir`.
  """
  def java_fetch!(dir) do
    path = Path.join(dir, "Fetch.java")

    write!(path, """
    import java.net.URI;
    import java.net.http.HttpClient;
    import java.net.http.HttpRequest;
    import java.net.http.HttpResponse;

    public class Fetch {
      public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newHttpClient();
        HttpResponse<String> r = client.send(HttpRequest.newBuilder(URI.create(args[0])).build(),
            HttpResponse.BodyHandlers.ofString());
        System.out.println("status " + r.statusCode());
        System.out.print(r.body());
        System.exit(r.statusCode() == 200 ? 0 : 1);
      }
    }
    """)

    Condukt.Dev.Netns.Cmd.run!(["/usr/bin/javac", "-d", dir, path], timeout: 60_000)
    File.chmod!(Path.join(dir, "Fetch.class"), 0o644)
    dir
  end

  ## Helpers

  defp write!(path, data) do
    File.mkdir_p!(Path.dirname(path))
    File.write!(path, data)
    File.chmod!(path, 0o644)
  end

  defp hex(bin), do: Base.encode16(bin, case: :lower)
  defp json(term), do: Condukt.JSON.encode!(term)

  defp zip(files) do
    entries =
      Enum.map(files, fn {name, data} ->
        {String.to_charlist(name), data}
      end)

    {:ok, {_, bin}} = :zip.create(~c"x.zip", entries, [:memory])
    bin
  end

  defp targz(files) do
    path = Path.join(System.tmp_dir!(), "condukt-reg-#{System.unique_integer([:positive])}.tgz")

    try do
      {:ok, tar} = :erl_tar.open(String.to_charlist(path), [:write, :compressed])

      for {name, data} <- files do
        :ok = :erl_tar.add(tar, data, String.to_charlist(name), [])
      end

      :ok = :erl_tar.close(tar)
      File.read!(path)
    after
      File.rm(path)
    end
  end
end
