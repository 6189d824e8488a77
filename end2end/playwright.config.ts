import { defineConfig } from "@playwright/test";
import * as path from "node:path";

// The server under test: the `tessera` binary with the demo fleet on a fresh database.
// scripts/test.sh sets TESSERA_BIN and TESSERA_DATA_DIR; the defaults suit a manual run
// after `cargo leptos build --split`.
const port = Number(process.env.E2E_PORT ?? 3100);
const root = path.resolve(__dirname, "..");
const bin = process.env.TESSERA_BIN ?? path.join(root, "target", "debug", "tessera");

export default defineConfig({
  testDir: "./tests",
  timeout: 90_000,
  expect: { timeout: 30_000 },
  retries: 0,
  workers: 1,
  reporter: [["list"]],
  outputDir: "test-results",
  use: {
    baseURL: `http://127.0.0.1:${port}`,
    screenshot: "only-on-failure",
    launchOptions: {
      executablePath: process.env.CHROMIUM_PATH ?? "/usr/bin/chromium",
      args: [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
      ],
    },
  },
  webServer: {
    command: `"${bin}" serve --demo --bind 127.0.0.1:${port}`,
    cwd: root,
    url: `http://127.0.0.1:${port}/healthz`,
    timeout: 90_000,
  expect: { timeout: 30_000 },
    reuseExistingServer: false,
    // SIGTERM lets the server stop the demo's sample tasks; the default SIGKILL would not.
    gracefulShutdown: { signal: "SIGTERM", timeout: 15_000 },
    stdout: "pipe",
    stderr: "pipe",
    env: {
      TESSERA_DATA_DIR: process.env.TESSERA_DATA_DIR ?? path.join(root, "target", "e2e-data"),
      RUST_LOG: "warn",
      TESSERA_ADMIN_PASSWORD: process.env.TESSERA_ADMIN_PASSWORD ?? "e2e-admin-password",
      // Fast syncs so placements, moves and stops show up within a few seconds.
      TESSERA_SYNC_INTERVAL: "1",
      // Short edge timeouts, so that walk.spec's pauses outlast every one of them.
      TESSERA_HEADER_TIMEOUT_SECS: "2",
      TESSERA_REQUEST_TIMEOUT_SECS: "8",
    },
  },
});
