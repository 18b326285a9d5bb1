# The systemd unit of `ninfer-serve`, in builtins only: the NixOS module, the flake's `lib` output and the
# offline tests all render it from here, and it evaluates without nixpkgs (so Nix 2.8 can test it).
#
#   (import ./unit.nix).mkUnit { executable = "/nix/store/...-ninfer/bin/ninfer-serve"; port = 8080; ... }
#
# returns { argv, execStart, environment, serviceConfig, unitConfig, installConfig, text }: the first six feed
# `systemd.services.ninfer` on NixOS; `text` is the same unit as a `.service` file for any other Linux.
let
  inherit (builtins)
    attrNames
    concatLists
    concatStringsSep
    fromJSON
    isBool
    isList
    map
    match
    readFile
    replaceStrings
    toString
    ;

  optional = cond: value: if cond then [ value ] else [ ];
  optionalAttrs = cond: attrs: if cond then attrs else { };

  # What TimeoutStopSec adds to the shutdown grace (systemd_unit.py's STOP_MARGIN_S).
  stopMarginSeconds = 30;

  # Names under which the API key is handed over with LoadCredential; `%d` is the credentials directory.
  credentialName = "api-key";

  # ExecStart is not a shell line: systemd splits on blanks, honours "..." with C escapes, and expands
  # %-specifiers and $VARIABLES. Arguments made only of these characters need no quoting; any other argument is
  # double-quoted with \, ", % and $ neutralised so that user-given values reach the program unchanged.
  plainArgument = "[A-Za-z0-9_./:=,+@-]+";
  escapeExecArgument =
    arg:
    let
      text = toString arg;
    in
    if match plainArgument text != null then
      text
    else
      "\"" + replaceStrings [ "\\" "\"" "%" "$" "\n" "\t" ] [ "\\\\" "\\\"" "%%" "$$" "\\n" "\\t" ] text + "\"";

  # Environment= takes "KEY=value" words; % is still a specifier there ($ is not expanded).
  escapeEnvironmentAssignment =
    name: value:
    "\"" + replaceStrings [ "\\" "\"" "%" "\n" ] [ "\\\\" "\\\"" "%%" "\\n" ] "${name}=${value}" + "\"";

  # The same value rendering NixOS uses for unit options: booleans as true/false, lists as repeated keys.
  renderValue = value: if isBool value then (if value then "true" else "false") else toString value;
  renderSection =
    name: attrs:
    let
      lines = concatLists (
        map (
          key:
          let
            value = attrs.${key};
          in
          map (item: "${key}=${renderValue item}") (if isList value then value else [ value ])
        ) (attrNames attrs)
      );
    in
    "[${name}]\n" + concatStringsSep "\n" lines + "\n";

  # The sandbox (each relaxation with its reason) lives in one JSON table that `ninfer-serve --print-systemd-unit`
  # reads too, so the NixOS unit and the plain-Linux unit cannot drift apart.
  hardening = (fromJSON (readFile ../python/ninfer/systemd_hardening.json)).settings;

  # A `.service` file from the pieces NixOS also takes (environment goes to Environment= lines).
  renderUnitFile =
    {
      unitConfig,
      serviceConfig,
      environment,
      installConfig,
    }:
    let
      environmentLines = map (name: escapeEnvironmentAssignment name environment.${name}) (attrNames environment);
    in
    concatStringsSep "\n" [
      (renderSection "Unit" unitConfig)
      (renderSection "Service" (serviceConfig // { Environment = environmentLines; }))
      (renderSection "Install" installConfig)
    ];

  mkUnit =
    {
      # Absolute path of the ninfer-serve executable.
      executable,
      host ? "127.0.0.1",
      port ? 8080,
      # One artifact served directly (the positional MODEL) ...
      model ? null,
      # ... or the router's JSON config (several models); at most one of the two.
      configFile ? null,
      logLevel ? "info",
      # A file readable by root; systemd hands a copy to the service (LoadCredential), so neither the dynamic
      # user nor the Nix store ever needs read access to the original.
      apiKeyFile ? null,
      webui ? false,
      webuiDir ? null,
      extraFlags ? [ ],
      # Whole seconds running requests get to finish after SIGTERM (ninfer-serve's --shutdown-grace, default 30);
      # TimeoutStopSec follows it.
      shutdownGrace ? 30,
      # CUDA device index; null leaves every GPU visible.
      gpu ? null,
      environment ? { },
      # null runs the service under a DynamicUser.
      user ? null,
      group ? null,
      stateDirectory ? "ninfer",
      cacheDirectory ? "ninfer",
      description ? "ninfer inference server",
    }:
    let
      grace =
        if builtins.isInt shutdownGrace && shutdownGrace >= 0 then
          shutdownGrace
        else
          throw "mkUnit: shutdownGrace must be whole seconds (0 or more), not ${builtins.toJSON shutdownGrace}";
      stateDir = "/var/lib/${stateDirectory}";
      cacheDir = "/var/cache/${cacheDirectory}";

      argv =
        [ executable ]
        ++ optional (model != null) (toString model)
        ++ [
          "--host"
          host
          "--port"
          (toString port)
          "--log-level"
          logLevel
        ]
        ++ optional (configFile != null) "--config"
        ++ optional (configFile != null) (toString configFile)
        ++ optional webui "--webui"
        ++ optional (webuiDir != null) "--webui-dir"
        ++ optional (webuiDir != null) (toString webuiDir)
        ++ optional (grace != 30) "--shutdown-grace"
        ++ optional (grace != 30) (toString grace)
        ++ map toString extraFlags;

      # The key file path is a systemd specifier, so it is appended unescaped.
      credentialArguments = optional (apiKeyFile != null) "--api-key-file %d/${credentialName}";

      execStart = concatStringsSep " " (map escapeExecArgument argv ++ credentialArguments);

      # Every cache (CUDA's PTX JIT cache, Triton, the embedded default model import) goes under CacheDirectory:
      # with ProtectSystem=strict nothing else is writable.
      serviceEnvironment =
        {
          HOME = stateDir;
          XDG_CACHE_HOME = cacheDir;
          CUDA_CACHE_PATH = "${cacheDir}/cuda";
          TRITON_CACHE_DIR = "${cacheDir}/triton";
        }
        # PCI bus order makes the index match nvidia-smi's numbering.
        // optionalAttrs (gpu != null) {
          CUDA_DEVICE_ORDER = "PCI_BUS_ID";
          CUDA_VISIBLE_DEVICES = toString gpu;
        }
        // environment;

      serviceConfig =
        {
          Type = "exec";
          ExecStart = execStart;
          Restart = "on-failure";
          RestartSec = 5;
          # The grace plus ninfer-serve's 5 s stream-end and 5 s connection waits and 20 s to spare, so SIGTERM's
          # graceful shutdown ends its streams before systemd's SIGKILL.
          TimeoutStopSec = grace + stopMarginSeconds;
          StateDirectory = stateDirectory;
          StateDirectoryMode = "0700";
          CacheDirectory = cacheDirectory;
          CacheDirectoryMode = "0700";
          WorkingDirectory = stateDir;
        }
        // (
          if user == null then
            { DynamicUser = true; }
          else
            {
              User = user;
              Group = if group == null then user else group;
            }
        )
        // optionalAttrs (apiKeyFile != null) { LoadCredential = "${credentialName}:${toString apiKeyFile}"; }
        // hardening;

      unitConfig = {
        Description = description;
        After = "network.target";
      };
      installConfig.WantedBy = "multi-user.target";

      text = renderUnitFile {
        inherit unitConfig serviceConfig installConfig;
        environment = serviceEnvironment;
      };
    in
    assert (model == null || configFile == null) || throw "ninfer unit: give either model or configFile, not both";
    {
      inherit
        argv
        execStart
        serviceConfig
        unitConfig
        installConfig
        text
        ;
      environment = serviceEnvironment;
    };
in
{
  inherit
    mkUnit
    renderUnitFile
    hardening
    ;
}
