import { test, expect } from "@playwright/test";
import { open, watchConsole } from "./browser";

test("hosts page shows the demo fleet and filters it after hydration", async ({ page }) => {
  const errors = watchConsole(page);
  await open(page, "/hosts");

  const cards = page.locator(".host-card");
  await expect(cards).toHaveCount(4);
  await expect(page.locator('[data-host="sim-h100-1"] .simulated')).toBeVisible();
  await expect(page.locator('[data-host="sim-h100-1"] .gpu')).toHaveCount(8);

  await page.getByLabel("Pool").selectOption("inference");
  await expect(cards).toHaveCount(2);
  await expect(page.locator(".filters .count")).toHaveText("2 of 4 hosts");
  await expect(page.locator('[data-host="sim-l4-1"]')).toBeVisible();
  await expect(page.locator('[data-host="sim-h100-1"]')).toHaveCount(0);

  await page.getByLabel("Status").selectOption("draining");
  await expect(page.getByText("No host matches these filters.")).toBeVisible();
  await page.getByLabel("Status").selectOption("");

  // The footer names the servers and the one that schedules.
  const footer = page.getByRole("contentinfo", { name: "Servers" });
  await expect(footer).toContainText("1 server");
  await expect(footer).toContainText("scheduling:");
  await page.screenshot({ path: "screenshots/hosts.png", fullPage: true });
  expect(errors).toEqual([]);
});
