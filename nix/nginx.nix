# nginx in front of several ninfer-serve instances (one per GPU), in builtins only, so the NixOS module, the
# flake's `lib.mkNginxConfig` and the offline tests render the same text:
#
#   (import ./nginx.nix).mkNginxConfig { listen = "0.0.0.0:8080"; instances = [ "127.0.0.1:18080" ... ]; }
#
# returns the text of nginx's `http { }` context (a map, an upstream, a server).
#
# Requests carrying X-Conversation-Id (llama-ui sends it; any client may) are routed by consistent hashing on it, so
# one conversation keeps reaching the instance whose prefix cache holds it, and losing an instance moves only the
# conversations that hashed to it. Requests without the header get a per-request key and spread over the instances.
# Health checks are nginx's passive ones (open-source nginx has no active probes): an instance that refuses or
# times out a connection is skipped for `failTimeout` and its requests go to the next instance on the ring.
let
  inherit (builtins) concatStringsSep map toString;

  mkNginxConfig =
    {
      # Where nginx listens ("ADDRESS:PORT"; IPv6 as "[::]:8080").
      listen,
      # The instances, "ADDRESS:PORT" each.
      instances,
      upstreamName ? "ninfer",
      # Passive health check: failed attempts within failTimeout that mark an instance down for failTimeout.
      maxFails ? 1,
      failTimeout ? "10s",
      # Image and long-prompt requests are large; nginx's default (1 MiB) would refuse them.
      maxBodySize ? "64m",
      # Generations stream for minutes; nginx's default (60 s between reads) would cut long prefills.
      readTimeout ? "3600s",
    }:
    let
      server = address: "    server ${address} max_fails=${toString maxFails} fail_timeout=${failTimeout};";
      # The nginx variable holding the routing key ("$" + name: Nix would read "$${" as an escape).
      affinity = "$" + upstreamName + "_affinity";
    in
    ''
      map $http_x_conversation_id ${affinity} {
          "" $request_id;
          default $http_x_conversation_id;
      }

      upstream ${upstreamName} {
          hash ${affinity} consistent;
      ${concatStringsSep "\n" (map server instances)}
          keepalive 16;
      }

      server {
          listen ${listen};
          client_max_body_size ${maxBodySize};

          location / {
              proxy_pass http://${upstreamName};
              proxy_http_version 1.1;
              proxy_set_header Connection "";
              proxy_set_header Host $host;
              proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
              # Server-sent events must reach the client token by token.
              proxy_buffering off;
              proxy_read_timeout ${readTimeout};
              proxy_send_timeout ${readTimeout};
              # A refused or timed-out connection (a stopped instance) is retried on the next instance;
              # nothing was sent yet, so this holds for POST too.
              proxy_next_upstream error timeout;
              proxy_connect_timeout 5s;
          }
      }
    '';
in
{
  inherit mkNginxConfig;
}
