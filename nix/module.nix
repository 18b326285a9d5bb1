# NixOS module: services.ninfer runs `ninfer-serve` as a hardened systemd service, or, with `gpus`, one instance per
# GPU (`ninfer-gpu<N>`, each with its GPU, loopback port and state and cache directories) behind nginx on
# host:port, routed by conversation (./nginx.nix).
# The unit itself (command line, environment, sandboxing) is rendered by ./unit.nix, shared with the flake's
# `lib.mkUnit` for other Linux systems; this file maps options onto it and adds users, firewall and assertions.
{
  config,
  lib,
  pkgs,
  ...
}:
let
  inherit (lib)
    mkEnableOption
    mkIf
    mkMerge
    mkOption
    mkPackageOption
    types
    ;

  cfg = config.services.ninfer;
  unit = import ./unit.nix;
  json = pkgs.formats.json { };

  # Flags the module sets itself from options; passing them again through extraFlags would contradict them.
  managedFlags = {
    "--host" = "host";
    "--port" = "port";
    "--config" = "models / settings";
    "--api-key-file" = "apiKeyFile";
    "--log-level" = "logLevel";
    "--webui" = "webui.enable";
    "--webui-dir" = "webui.directory";
    "--spec" = "speculative.method";
    "--draft-tokens" = "speculative.draftTokens";
    "--host-kv-mib" = "hostTier.kvMib";
    "--host-state-slots" = "hostTier.stateSlots";
    "--vision" = "vision.enable";
    "--shutdown-grace" = "shutdownGrace";
  }
  // builtins.listToAttrs (
    lib.mapAttrsToList (name: _: {
      name = limitFlag name;
      value = "vision.mediaLimits.${name}";
    }) cfg.vision.mediaLimits
  );
  # Speculative decoding's flags (none when it is off).
  specFlags = lib.optionals (cfg.speculative.method != "none") [
    "--spec"
    cfg.speculative.method
    "--draft-tokens"
    (toString cfg.speculative.draftTokens)
  ];
  # The prefix cache's host tier (none when both are 0): the default of every model, which `engine` may override.
  hostTierFlags =
    lib.optionals (cfg.hostTier.kvMib > 0) [
      "--host-kv-mib"
      (toString cfg.hostTier.kvMib)
    ]
    ++ lib.optionals (cfg.hostTier.stateSlots > 0) [
      "--host-state-slots"
      (toString cfg.hostTier.stateSlots)
    ];
  # The vision tower's flags: --vision, and one --max-... flag per media limit set (MediaLimits' field names).
  limitFlag = name: "--" + builtins.replaceStrings [ "_" ] [ "-" ] name;
  visionFlags =
    lib.optional cfg.vision.enable "--vision"
    ++ builtins.concatLists (
      lib.mapAttrsToList (name: value: [
        (limitFlag name)
        (toString value)
      ]) cfg.vision.mediaLimits
    );
  flagName = flag: builtins.head (builtins.split "=" flag);
  misusedFlags = builtins.filter (flag: managedFlags ? ${flagName flag}) cfg.extraFlags;

  modelOptions = {
    options = {
      path = mkOption {
        type = types.str;
        example = "/var/lib/models/qwen3.5-27b.ninfer";
        description = "The `.ninfer` artifact of this model (a path outside the Nix store is read in place).";
      };
      engine = mkOption {
        type = types.attrsOf json.type;
        default = { };
        example = {
          max_context = 65536;
          kv_dtype = "fp8";
          max_concurrency = 4;
          prefix_cache = true;
          device_state_slots = 16;
          snapshot_interval = 4096;
          host_kv_mib = 16384;
          host_state_slots = 32;
        };
        description = ''
          Engine presets of this model, written next to `path` in its entry of the router config: the router
          config's engine keys (docs/router.md), e.g. `max_context`, `kv_dtype`, `max_concurrency`, and the prefix
          cache's `prefix_cache` (true/false), `device_state_slots`, `snapshot_interval`, and its host tier's
          `host_kv_mib` and `host_state_slots` (docs/prefix-cache.md).
        '';
      };
    };
  };

  # The router config: the named models plus the free-form top-level settings (TTL, aliases, ...).
  routerConfig = cfg.settings // {
    models = builtins.mapAttrs (_: model: { inherit (model) path; } // model.engine) cfg.models;
  };
  usesRouterConfig = cfg.models != { };
  configFile = json.generate "ninfer-serve.json" routerConfig;

  isLoopback = host: host == "localhost" || lib.hasPrefix "127." host || host == "::1";

  renderUnit =
    instance:
    unit.mkUnit (
      {
        executable = "${cfg.package}/bin/ninfer-serve";
        inherit (cfg)
          host
          port
          model
          logLevel
          shutdownGrace
          apiKeyFile
          gpu
          environment
          user
          group
          stateDirectory
          cacheDirectory
          ;
        extraFlags = specFlags ++ hostTierFlags ++ visionFlags ++ cfg.extraFlags;
        configFile = if usesRouterConfig then configFile else null;
        webui = cfg.webui.enable;
        webuiDir = cfg.webui.directory;
      }
      // instance
    );
  asService = rendered: {
    description = rendered.unitConfig.Description;
    after = [ rendered.unitConfig.After ];
    wantedBy = [ rendered.installConfig.WantedBy ];
    inherit (rendered) environment serviceConfig;
  };

  # One instance per GPU: the i-th listed GPU's instance listens on 127.0.0.1:(instanceBasePort + i).
  multiGpu = cfg.gpus != [ ];
  instances = lib.imap0 (position: gpu: {
    name = "ninfer-gpu${toString gpu}";
    port = cfg.instanceBasePort + position;
    inherit gpu;
  }) cfg.gpus;
  instanceUnit =
    instance:
    renderUnit {
      host = "127.0.0.1";
      inherit (instance) port gpu;
      stateDirectory = "${cfg.stateDirectory}-gpu${toString instance.gpu}";
      cacheDirectory = "${cfg.cacheDirectory}-gpu${toString instance.gpu}";
      description = "ninfer inference server on GPU ${toString instance.gpu}";
    };
  listenAddress = if builtins.match ".*:.*" cfg.host != null then "[${cfg.host}]:${toString cfg.port}" else "${cfg.host}:${toString cfg.port}";
  nginxConfig = (import ./nginx.nix).mkNginxConfig {
    listen = listenAddress;
    instances = map (instance: "127.0.0.1:${toString instance.port}") instances;
  };
in
{
  options.services.ninfer = {
    enable = mkEnableOption "the ninfer inference server";

    package = mkPackageOption pkgs "ninfer" { };

    host = mkOption {
      type = types.str;
      default = "127.0.0.1";
      description = "Address to listen on. Use `0.0.0.0` or `::` (with openFirewall) to serve the network.";
    };

    port = mkOption {
      type = types.port;
      default = 8080;
      description = "TCP port to listen on.";
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = "Open `port` in the firewall.";
    };

    model = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "/var/lib/models/qwen3.5-9b.ninfer";
      description = ''
        One `.ninfer` artifact to serve. With neither `model` nor `models`, ninfer-serve serves its embedded
        default model, imported into the cache directory on first start.
      '';
    };

    models = mkOption {
      type = types.attrsOf (types.submodule modelOptions);
      default = { };
      description = "Several models, by name; the router loads one at a time on demand.";
    };

    settings = mkOption {
      type = types.attrsOf json.type;
      default = { };
      example = {
        ttl = 600;
      };
      description = "Free-form top-level router settings, written to the config file with `models`.";
    };

    shutdownGrace = mkOption {
      type = types.ints.unsigned;
      default = 30;
      description = ''
        Seconds running requests get to finish after SIGTERM before their streams are ended with an error
        (ninfer-serve's `--shutdown-grace`); the unit's `TimeoutStopSec` is this plus 30 s.
      '';
    };

    extraFlags = mkOption {
      type = types.listOf types.str;
      default = [ ];
      example = [
        "--max-concurrency"
        "4"
        "--kv-dtype"
        "fp8"
      ];
      description = "Further command-line options of ninfer-serve (escaped for systemd).";
    };

    apiKeyFile = mkOption {
      type = types.nullOr (types.strMatching "/.*");
      default = null;
      example = "/run/secrets/ninfer-api-keys";
      description = ''
        File with the accepted API keys, one per line. It is passed with systemd's LoadCredential (read by
        root at start, never copied into the Nix store), so give its path as a string.
      '';
    };

    environment = mkOption {
      type = types.attrsOf types.str;
      default = { };
      description = "Extra environment variables of the service (they override the module's own).";
    };

    user = mkOption {
      type = types.nullOr types.str;
      default = null;
      description = "User to run as (created by the module); null runs the service under a DynamicUser.";
    };

    group = mkOption {
      type = types.nullOr types.str;
      default = null;
      description = "Group to run as (created by the module); null means the user's own group.";
    };

    stateDirectory = mkOption {
      type = types.strMatching "[A-Za-z0-9._-]+";
      default = "ninfer";
      description = "Name of the state directory under /var/lib (HOME and working directory of the service).";
    };

    cacheDirectory = mkOption {
      type = types.strMatching "[A-Za-z0-9._-]+";
      default = "ninfer";
      description = "Name of the cache directory under /var/cache (CUDA, Triton and model-import caches).";
    };

    gpu = mkOption {
      type = types.nullOr types.ints.unsigned;
      default = null;
      example = 0;
      description = "Index of the GPU to use (CUDA_VISIBLE_DEVICES, in nvidia-smi order); null shows all.";
    };

    gpus = mkOption {
      type = types.listOf types.ints.unsigned;
      default = [ ];
      example = [
        0
        1
        2
        3
      ];
      description = ''
        GPUs (nvidia-smi indices) to run one instance each on, as services `ninfer-gpu<N>` listening on loopback
        ports from `instanceBasePort`, with state and cache directories `<stateDirectory>-gpu<N>`. nginx listens
        on `host`:`port` in front of them and routes each conversation (X-Conversation-Id) to one instance by
        consistent hashing. Empty: one service `ninfer` on `host`:`port` (and `gpu`).
      '';
    };

    instanceBasePort = mkOption {
      type = types.port;
      default = 18080;
      description = "With `gpus`: the loopback port of the first instance; the next ones count up from it.";
    };

    webui = {
      enable = mkEnableOption "the web UI at `/` and the dashboard at `/dashboard`";
      directory = mkOption {
        type = types.nullOr types.path;
        default = null;
        description = ''
          The llama-ui bundle to serve at `/` (ninfer-serve --webui-dir); `webui.enable` needs it. The flake's
          module defaults it to the flake's pinned `webui` package.
        '';
      };
    };

    speculative = {
      method = mkOption {
        type = types.enum [
          "none"
          "mtp"
        ];
        default = "none";
        description = ''
          Speculative decoding: `mtp` lets the model's MTP head draft tokens that the model verifies in one pass
          (lossless: the same output as without; the CPU backend only for now). See docs/speculative-decoding.md.
        '';
      };
      draftTokens = mkOption {
        type = types.ints.between 1 5;
        default = 3;
        description = "Drafts per round with `speculative.method = \"mtp\"`.";
      };
    };

    hostTier = {
      kvMib = mkOption {
        type = types.ints.unsigned;
        default = 0;
        example = 16384;
        description = ''
          MiB of host memory (page-locked on a GPU) for the prefix-cache KV blocks the GPU evicts: restored from
          there instead of recomputed, and kept when the router swaps the model out, so it comes back warm. Every
          model that uses it keeps its own tier for the server's lifetime: host memory is bounded by the sum of the
          models' tiers. 0: none. A model's `engine.host_kv_mib` overrides it. See docs/prefix-cache.md.
        '';
      };
      stateSlots = mkOption {
        type = types.ints.unsigned;
        default = 0;
        example = 32;
        description = ''
          Gated DeltaNet state snapshots the host tier holds beside `kvMib`, one state image each (about 147 MiB
          for Qwen3.5-27B, 61 MiB for 35B-A3B). 0: none. A model's `engine.host_state_slots` overrides it.
        '';
      };
    };

    vision = {
      enable = mkEnableOption "the vision tower (ninfer-serve --vision): requests may carry images and video (Qwen3.5 artifacts; docs/vision.md)";
      mediaLimits = mkOption {
        type = types.attrsOf types.ints.positive;
        default = { };
        example = {
          max_images_per_request = 4;
          max_vision_tokens_per_request = 8192;
        };
        description = ''
          Media limits of requests with images or video, each a `--max-...` flag of ninfer-serve: the keys are
          docs/vision.md's ("Limits"), e.g. `max_images_per_request`; the rest keep their defaults. A model of
          `models` may set its own in its `engine.media_limits` (and `engine.vision`, docs/router.md).
        '';
      };
    };

    logLevel = mkOption {
      type = types.enum [
        "debug"
        "info"
        "warning"
        "error"
        "critical"
      ];
      default = "info";
      description = "Log level of ninfer-serve.";
    };
  };

  config = mkIf cfg.enable (mkMerge [
    {
      assertions = [
        {
          assertion = cfg.model == null || cfg.models == { };
          message = "services.ninfer: set either `model` (one artifact) or `models` (the router), not both.";
        }
        {
          assertion = cfg.settings == { } || cfg.models != { };
          message = "services.ninfer: `settings` configure the router; they need `models`.";
        }
        {
          assertion = !(cfg.openFirewall && isLoopback cfg.host);
          message = "services.ninfer: openFirewall is set but host ${cfg.host} only listens on loopback.";
        }
        {
          assertion = cfg.user != null || cfg.group == null;
          message = "services.ninfer: `group` needs `user` (without a user the service runs as a DynamicUser).";
        }
        {
          assertion = cfg.apiKeyFile == null || !(lib.hasPrefix builtins.storeDir cfg.apiKeyFile);
          message = "services.ninfer: apiKeyFile is in the world-readable Nix store; keep secrets outside it.";
        }
        {
          # ninfer-serve --webui alone looks for a bundle built by `make webui` in the service's cache, which a
          # service never has: it would refuse to start.
          assertion = !cfg.webui.enable || cfg.webui.directory != null;
          message =
            "services.ninfer: webui.enable needs webui.directory, a built llama-ui bundle (the flake's module "
            + "defaults it to the flake's `webui` package; otherwise set it, e.g. to ninfer.packages.<system>.webui).";
        }
        {
          assertion = misusedFlags == [ ];
          message =
            "services.ninfer: extraFlags contains "
            + lib.concatStringsSep ", " misusedFlags
            + "; use the module's options ("
            + lib.concatStringsSep ", " (map (f: managedFlags.${flagName f}) misusedFlags)
            + ") instead.";
        }
      ];

      networking.firewall.allowedTCPPorts = lib.optional cfg.openFirewall cfg.port;
    }

    (mkIf (!multiGpu) { systemd.services.ninfer = asService (renderUnit { }); })

    (mkIf multiGpu {
      assertions = [
        {
          assertion = cfg.gpu == null;
          message = "services.ninfer: set either `gpu` (one instance) or `gpus` (one instance per GPU), not both.";
        }
        {
          assertion = lib.unique cfg.gpus == cfg.gpus;
          message = "services.ninfer: `gpus` lists a GPU twice.";
        }
        {
          assertion = lib.all (instance: instance.port != cfg.port) instances;
          message = "services.ninfer: an instance port (from instanceBasePort) is nginx's `port`.";
        }
      ];
      systemd.services = builtins.listToAttrs (
        map (instance: {
          inherit (instance) name;
          value = asService (instanceUnit instance);
        }) instances
      );
      services.nginx = {
        enable = true;
        appendHttpConfig = nginxConfig;
      };
    })

    (mkIf (cfg.user != null) {
      users.users.${cfg.user} = {
        isSystemUser = true;
        group = if cfg.group == null then cfg.user else cfg.group;
        home = "/var/lib/${cfg.stateDirectory}";
      };
      users.groups.${if cfg.group == null then cfg.user else cfg.group} = { };
    })
  ]);
}
