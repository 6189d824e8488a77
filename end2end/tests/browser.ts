import { Page, ConsoleMessage } from "@playwright/test";

// Errors in the browser console fail a test: hydration problems show up there first.
export function watchConsole(page: Page): string[] {
  const errors: string[] = [];
  page.on("console", (msg: ConsoleMessage) => {
    if (msg.type() === "error") errors.push(msg.text());
  });
  page.on("pageerror", (err) => errors.push(err.message));
  return errors;
}
